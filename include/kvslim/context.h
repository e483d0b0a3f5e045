#pragma once
// Stored compressed contexts: compress a context once, answer any number of questions from it.
//
// A Context is the cache of a context compressed on its own, exactly as `kvslim generate -f DOC
// --question Q` compresses DOC before appending Q (the same Request path, kvslim/request.h): the
// context's last token is the boundary, and a question is appended after it uncompressed. It is
// saved to a file and loaded in another process; a question answered from a loaded context gives
// bit-identical logits and tokens to the uncached run with the same split, without prefilling the
// context again.
//
// The file holds every segment's entries with their original positions and codec payloads (row
// codecs, KIVI groups and residual windows, precision tiers, latent codes and their bases,
// cross-layer sharing), the press as run and its statistics, the token ids (and the text when built
// from text), the last context token's logits, a format version, and the model's fingerprint
// (architecture, hyper-parameters, tokenizer vocabulary digest, tensor-data digest). It is written
// atomically (a temporary file renamed over the target) with an XXH64 checksum of its payload.
//
// Presses that keep per-request state for decode (H2O's accumulated attention, decoding(...),
// threshold or KVzap presses with decode-time eviction, DuoAttention, ClusterKV's decode-time
// selection) are refused for storage: Press::storage_refusal() says why.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/generate.h"
#include "kvslim/model.h"
#include "kvslim/request.h"

namespace kvslim {

class KVCache;  // internal (src/kv/cache.h)

/// Version of the context file format this build writes and reads.
constexpr uint32_t kContextFormatVersion = 2;

/// How a context is compressed (the flags of `kvslim generate` that act before the question).
struct ContextOptions {
  std::string press = "none";  ///< press spec (kvslim/press.h)
  double ratio = 0.0;          ///< fills every `ratio` the spec leaves unset (--compression-ratio)
  int chunk_size = 0;          ///< > 0: the press compresses after every chunk of this many tokens
  SessionOptions session;      ///< context size, cache codecs and KIVI options, prefill batch, progress callback
};

/// What a stored context holds, as `kvslim context info` prints it.
struct ContextInfo {
  uint32_t format_version = 0;
  std::string arch;                 ///< the model's architecture
  int n_layer = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0;
  uint64_t vocab_digest = 0;        ///< XXH64 of the tokenizer's vocabulary (Model::vocab_digest)
  uint64_t tensor_digest = 0;       ///< XXH64 of the weights as stored (Model::tensor_digest)
  uint64_t fingerprint = 0;         ///< XXH64 over the architecture, hyper-parameters and both digests
  std::string press;                ///< the press as run (Press::describe)
  std::string cache_type;           ///< e.g. "k=q8_0 v=q8_0" (describe_cache_config)
  int chunk_size = 0;
  int context_tokens = 0;           ///< BOS included
  int32_t next_position = 0;        ///< where a question continues
  size_t entries_kept = 0, entries_total = 0;
  size_t kv_bytes = 0;              ///< cache bytes (KVCache::bytes)
  size_t full_f16_bytes = 0;        ///< a full f16 cache of the context
  size_t shared_bytes = 0;          ///< shared latent bases the cache uses (stored in the file too)
  size_t peak_kv_bytes = 0;         ///< largest cache size during the build
  double prefill_seconds = 0, press_seconds = 0;  ///< of the build
  std::string press_report;         ///< Press::report() after the build
  size_t file_bytes = 0;            ///< size of the file read or last written (0 otherwise)
  size_t held_bytes = 0;            ///< memory the context holds: its cache's allocations, tokens, text, logits
  double compression_ratio() const { return entries_total ? 1.0 - double(entries_kept) / entries_total : 0.0; }
  double memory_ratio() const { return full_f16_bytes ? double(kv_bytes) / full_f16_bytes : 0.0; }
};

/// A compressed context: an opaque, immutable handle, cheap to copy (copies share the entries).
class Context {
 public:
  /// Prefills `tokens` (BOS included when wanted) and compresses them with opt.press, through the
  /// same Request path as `generate`. Throws kvslim::Error for a bad press spec, a press that cannot
  /// be stored (naming it and why), an empty context or one longer than the context size.
  static Context build(const Model& model, std::vector<Token> tokens, const ContextOptions& opt);
  /// The same from text, tokenized as `generate -f` does (BOS as the vocabulary wants); the text is
  /// kept in the file so that `generate --context` can echo it.
  static Context build(const Model& model, const std::string& text, const ContextOptions& opt);

  /// Writes the context to `path` atomically (PATH.tmp.PID, then renamed). Throws kvslim::Error
  /// naming the path on an I/O failure (the target is left as it was).
  void save(const std::string& path) const;
  /// Reads a context written by save() for `model`. Throws kvslim::Error naming the file and what
  /// is wrong: not a context file, another format version, a truncated or corrupted file (checksum),
  /// a file of another model (naming the part of the fingerprint that differs), an invalid payload.
  static Context load(const Model& model, const std::string& path);
  /// The bytes save() writes, for stores other than files (a server's Redis or memory tier).
  std::string image() const;
  /// Context::load from bytes made by image() (or read from a file); `label` names the source in
  /// errors. Throws kvslim::Error as load().
  static Context from_image(const Model& model, const void* data, size_t size, const std::string& label);
  /// The digest of the model identity a context is valid for (architecture, hyper-parameters,
  /// vocabulary and tensor digests): ContextInfo::fingerprint of every context built with `model`.
  static uint64_t fingerprint(const Model& model);

  /// Reads and checks a file (magic, version, checksum, payload) without a model; for
  /// `kvslim context info`. Throws kvslim::Error as load().
  static ContextInfo inspect(const std::string& path);

  ContextInfo info() const;
  /// The stored cache (shared: see request()), read-only.
  const KVCache& cache() const;
  const std::vector<Token>& tokens() const;
  /// The text the context was built from ("" when built from tokens).
  const std::string& text() const;

  /// A request that answers `question` from this context: the question is prefilled on a cache
  /// that reads the stored entries in place, read-only and shared by every request answering from
  /// this context, and owns only its tail (KVCache::share: the question, the answer, and the
  /// context's last partly filled key tile or KIVI residual window, copied); decoding follows
  /// (run(), step(), step_batch()). The logits are bit for bit those of a full copy of the cache.
  /// opt.session.n_ctx and batch apply; the cache codecs are the context's; opt.chunk_size and
  /// auto-budget must be off.
  /// Throws kvslim::Error when the model is not the context's (fingerprint), the prompt does not fit
  /// the context size, or the options ask for what a stored context cannot do.
  std::unique_ptr<Request> request(const Model& model, std::vector<Token> question, RequestOptions opt = {}) const;

  /// The stored state: defined in src/context/context.cpp only (so only the library makes one).
  struct Data;
  explicit Context(std::shared_ptr<const Data> d) : d_(std::move(d)) {}

 private:
  std::shared_ptr<const Data> d_;
};

/// `generate` from a stored context: opt.question (tokenized without BOS) is appended to the
/// context and decoded with opt.n_predict, opt.sampling, opt.session.n_ctx; opt.context,
/// opt.context_tokens, opt.chunk_size and opt.auto_budget must be empty / off (the context is
/// already compressed). Output is token for token the one of generate() with the context's press,
/// cache options and chunking. Throws kvslim::Error as Context::request.
GenerateResult generate(const Model& model, const Context& context, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace kvslim
