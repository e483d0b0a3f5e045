// Stored compressed contexts: build through the request path, save, load, answer questions.
#include "kvslim/context.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <unistd.h>

#include "context/file.h"
#include "kv/serialize.h"
#include "kvslim/press.h"
#include "run/steps.h"
#include "util/hash64.h"

namespace kvslim {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'L', 'M', 'C', 'T', 'X'};

/// The model identity a context is only valid for.
struct Fingerprint {
  std::string arch;
  int32_t n_vocab = 0, n_ctx_train = 0, n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float rms_eps = 0, rope_freq_base = 0, rope_freq_scale = 0;
  uint8_t rope_neox = 0;
  uint64_t vocab_digest = 0, tensor_digest = 0;
  // YaRN's settings (HParams::yarn_*): a context built with other ones holds other rotations.
  float yarn_ext_factor = 0, yarn_attn_factor = 0, yarn_beta_fast = 0, yarn_beta_slow = 0;
  int32_t yarn_orig_ctx = 0;

  static Fingerprint of(const Model& m) {
    const HParams& hp = m.hparams();
    Fingerprint f;
    f.arch = hp.arch;
    f.n_vocab = hp.n_vocab, f.n_ctx_train = hp.n_ctx_train, f.n_embd = hp.n_embd, f.n_ff = hp.n_ff;
    f.n_layer = hp.n_layer, f.n_head = hp.n_head, f.n_head_kv = hp.n_head_kv, f.head_dim = hp.head_dim;
    f.rms_eps = hp.rms_eps, f.rope_freq_base = hp.rope_freq_base, f.rope_freq_scale = hp.rope_freq_scale;
    f.rope_neox = hp.rope_neox ? 1 : 0;
    f.vocab_digest = m.vocab_digest();
    f.tensor_digest = m.tensor_digest();
    f.yarn_ext_factor = hp.yarn_ext_factor, f.yarn_attn_factor = hp.yarn_attn_factor;
    f.yarn_beta_fast = hp.yarn_beta_fast, f.yarn_beta_slow = hp.yarn_beta_slow, f.yarn_orig_ctx = hp.yarn_orig_ctx;
    return f;
  }
  void write(kv::ByteWriter& w) const {
    w.str(arch);
    for (int32_t v : {n_vocab, n_ctx_train, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim}) w.i32(v);
    for (float v : {rms_eps, rope_freq_base, rope_freq_scale}) w.raw(&v, 4);
    w.u8(rope_neox);
    w.u64(vocab_digest);
    w.u64(tensor_digest);
    for (float v : {yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow}) w.raw(&v, 4);
    w.i32(yarn_orig_ctx);
  }
  static Fingerprint read(kv::ByteReader& r) {
    Fingerprint f;
    f.arch = r.str("model architecture");
    if (f.arch.size() > 64) r.fail(fmt::format("model architecture name of {} bytes", f.arch.size()));
    for (int32_t* v : {&f.n_vocab, &f.n_ctx_train, &f.n_embd, &f.n_ff, &f.n_layer, &f.n_head, &f.n_head_kv, &f.head_dim})
      *v = r.i32("model hyper-parameters");
    for (float* v : {&f.rms_eps, &f.rope_freq_base, &f.rope_freq_scale}) r.raw(v, 4, "model hyper-parameters");
    f.rope_neox = r.u8("model rope type");
    f.vocab_digest = r.u64("vocabulary digest");
    f.tensor_digest = r.u64("tensor data digest");
    for (float* v : {&f.yarn_ext_factor, &f.yarn_attn_factor, &f.yarn_beta_fast, &f.yarn_beta_slow})
      r.raw(v, 4, "model RoPE settings");
    f.yarn_orig_ctx = r.i32("model RoPE settings");
    // Bounds that keep a corrupt header from sizing anything absurd (the cache reader checks the rest).
    if (f.n_layer < 1 || f.n_layer > 4096 || f.n_head_kv < 1 || f.n_head_kv > 4096 || f.head_dim < 1 ||
        f.head_dim > 4096 || f.n_vocab < 1 || f.n_vocab > (1 << 24))
      r.fail(fmt::format("implausible model shape: {} layers, {} KV heads, head_dim {}, {} vocabulary entries",
                         f.n_layer, f.n_head_kv, f.head_dim, f.n_vocab));
    return f;
  }
  uint64_t digest() const {
    kv::ByteWriter w;
    write(w);
    return hash64(w.out().data(), w.out().size());
  }
  /// "" when `o` (the model at hand) is this one, else what differs.
  std::string differs(const Fingerprint& o) const {
    if (arch != o.arch) return fmt::format("architecture '{}' (the model's is '{}')", arch, o.arch);
    const std::pair<const char*, std::pair<double, double>> hp[] = {
        {"n_vocab", {n_vocab, o.n_vocab}},        {"n_ctx_train", {n_ctx_train, o.n_ctx_train}},
        {"n_embd", {n_embd, o.n_embd}},           {"n_ff", {n_ff, o.n_ff}},
        {"n_layer", {n_layer, o.n_layer}},        {"n_head", {n_head, o.n_head}},
        {"n_head_kv", {n_head_kv, o.n_head_kv}},  {"head_dim", {head_dim, o.head_dim}},
        {"rms_eps", {rms_eps, o.rms_eps}},        {"rope_freq_base", {rope_freq_base, o.rope_freq_base}},
        {"rope_freq_scale", {rope_freq_scale, o.rope_freq_scale}}, {"rope type", {rope_neox, o.rope_neox}},
        {"yarn_ext_factor", {yarn_ext_factor, o.yarn_ext_factor}}, {"yarn_attn_factor", {yarn_attn_factor, o.yarn_attn_factor}},
        {"yarn_beta_fast", {yarn_beta_fast, o.yarn_beta_fast}},    {"yarn_beta_slow", {yarn_beta_slow, o.yarn_beta_slow}},
        {"yarn_orig_ctx", {yarn_orig_ctx, o.yarn_orig_ctx}}};
    for (const auto& [name, v] : hp)
      if (std::memcmp(&v.first, &v.second, sizeof(double)) != 0)
        return fmt::format("hyper-parameter {} = {} (the model's is {})", name, v.first, v.second);
    if (vocab_digest != o.vocab_digest)
      return fmt::format("tokenizer vocabulary digest {:016x} (the model's is {:016x})", vocab_digest, o.vocab_digest);
    if (tensor_digest != o.tensor_digest)
      return fmt::format("tensor data digest {:016x} (the model's is {:016x}: other weights)", tensor_digest,
                         o.tensor_digest);
    return {};
  }
};

}  // namespace

struct Context::Data {
  Fingerprint fp;
  std::string press;
  int chunk_size = 0;
  RequestStats stats;
  std::string press_report;
  int32_t next_position = 0;
  std::vector<Token> tokens;
  std::string text;
  std::vector<float> logits;
  KVCache cache{1, 1, 32};  // a placeholder until the built or read cache replaces it
  size_t file_bytes = 0;

  ContextInfo info() const {
    ContextInfo i;
    i.format_version = kContextFormatVersion;
    i.arch = fp.arch;
    i.n_layer = fp.n_layer, i.n_head_kv = fp.n_head_kv, i.head_dim = fp.head_dim, i.n_vocab = fp.n_vocab;
    i.vocab_digest = fp.vocab_digest, i.tensor_digest = fp.tensor_digest, i.fingerprint = fp.digest();
    i.press = press;
    const Segment& s = cache.seg(0, 0);
    i.cache_type = describe_cache_config(s.key_codec(), s.value_codec(), s.quant());
    i.chunk_size = chunk_size;
    i.context_tokens = static_cast<int>(tokens.size());
    i.next_position = next_position;
    i.entries_kept = stats.entries_kept, i.entries_total = stats.entries_total;
    i.kv_bytes = stats.kv_bytes, i.full_f16_bytes = stats.full_f16_bytes, i.shared_bytes = stats.shared_bytes;
    i.peak_kv_bytes = stats.peak_kv_bytes;
    i.prefill_seconds = stats.prefill_seconds, i.press_seconds = stats.press_seconds;
    i.press_report = press_report;
    i.file_bytes = file_bytes;
    i.held_bytes = sizeof(Data) + cache.allocated_bytes() + tokens.capacity() * sizeof(Token) + text.capacity() +
                   logits.capacity() * sizeof(float) + press.capacity() + press_report.capacity();
    return i;
  }

  std::string payload() const {
    kv::ByteWriter w;
    fp.write(w);
    w.str(press);
    w.i32(chunk_size);
    w.str(press_report);
    w.u64(stats.entries_total);
    w.u64(stats.full_f16_bytes);
    w.u64(stats.peak_kv_bytes);
    w.f64(stats.prefill_seconds);
    w.f64(stats.press_seconds);
    w.i32(next_position);
    w.vec(tokens);
    w.str(text);
    w.vec(logits);
    kv::CacheIO::write(w, cache);
    return std::move(w.out());
  }

  /// Parses a payload (the envelope already checked). Figures that follow from the cache are
  /// recomputed from it, never trusted from the file.
  static std::shared_ptr<Data> parse(kv::ByteReader& r) {
    auto d = std::make_shared<Data>();
    d->fp = Fingerprint::read(r);
    d->press = r.str("press spec");
    if (d->press.size() > kMaxPressSpecLength) r.fail(fmt::format("press spec of {} bytes", d->press.size()));
    d->chunk_size = r.i32("chunk size");
    if (d->chunk_size < 0) r.fail(fmt::format("chunk size {} is negative", d->chunk_size));
    d->press_report = r.str("press report");
    RequestStats& st = d->stats;
    st.entries_total = r.u64("entries total");
    st.full_f16_bytes = r.u64("full f16 bytes");
    st.peak_kv_bytes = r.u64("peak KV bytes");
    st.prefill_seconds = r.f64("prefill seconds");
    st.press_seconds = r.f64("press seconds");
    d->next_position = r.i32("next position");
    d->tokens = r.vec<Token>("context tokens");
    d->text = r.str("context text");
    d->logits = r.vec<float>("context logits");
    const size_t n = d->tokens.size();
    if (n == 0) r.fail("the context has no tokens");
    if (d->next_position != static_cast<int32_t>(n))
      r.fail(fmt::format("next position {} for {} context tokens", d->next_position, n));
    for (size_t i = 0; i < n; ++i)
      if (d->tokens[i] < 0 || d->tokens[i] >= d->fp.n_vocab)
        r.fail(fmt::format("context token {} is {}, outside the vocabulary of {}", i, d->tokens[i], d->fp.n_vocab));
    if (d->logits.size() != static_cast<size_t>(d->fp.n_vocab))
      r.fail(fmt::format("{} context logits for a vocabulary of {}", d->logits.size(), d->fp.n_vocab));
    d->cache = kv::CacheIO::read(r, d->fp.n_layer, d->fp.n_head_kv, d->fp.head_dim, d->next_position);
    d->cache.shrink_to_fit();  // kept as read: no room to grow
    d->cache.share();          // requests answering from it read its entries in place
    if (r.left()) r.fail(fmt::format("{} bytes after the cache", r.left()));
    const KVCache& c = d->cache;
    if (st.entries_total != n * static_cast<size_t>(c.n_layer()) * c.n_head_kv())
      r.fail(fmt::format("entries total {} for {} tokens", st.entries_total, n));
    if (st.full_f16_bytes != c.full_f16_bytes(n))
      r.fail(fmt::format("full f16 bytes {} for {} tokens (expected {})", st.full_f16_bytes, n, c.full_f16_bytes(n)));
    st.context_tokens = static_cast<int>(n);
    st.entries_kept = c.entries();
    for (int l = 0; l < c.n_layer(); ++l) st.kept_per_layer.push_back(c.entries(l));
    st.kv_bytes = c.bytes();
    st.shared_bytes = c.shared_bytes();
    return d;
  }
};

namespace context {

std::string file_image(const std::string& payload, uint32_t version) {
  kv::ByteWriter w;
  w.raw(kMagic, sizeof(kMagic));
  w.u32(version);
  w.u32(0);
  w.u64(payload.size());
  w.u64(hash64(payload.data(), payload.size()));
  w.raw(payload.data(), payload.size());
  return std::move(w.out());
}

namespace {

std::shared_ptr<Context::Data> parse_image(const uint8_t* data, size_t size, const std::string& label) {
  if (size < kHeaderBytes || std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    if (size >= sizeof(kMagic) && std::memcmp(data, kMagic, sizeof(kMagic)) == 0)
      throw Error(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte header", label, size, kHeaderBytes));
    throw Error(fmt::format("{}: not a kvslim context file (no KVSLMCTX magic{})", label,
                            size < sizeof(kMagic) ? fmt::format("; {} bytes", size) : ""));
  }
  kv::ByteReader h(data + sizeof(kMagic), kHeaderBytes - sizeof(kMagic), label);
  const uint32_t version = h.u32("format version");
  const uint32_t reserved = h.u32("reserved field");
  const uint64_t n = h.u64("payload size");
  const uint64_t sum = h.u64("checksum");
  if (version != kContextFormatVersion)
    throw Error(fmt::format("{}: context format version {}, this build reads version {} (build the context again)",
                            label, version, kContextFormatVersion));
  if (reserved != 0) throw Error(fmt::format("{}: reserved header field is {}, not 0 (corrupted)", label, reserved));
  if (n != size - kHeaderBytes)
    throw Error(fmt::format("{}: {}: the header announces {} payload bytes, the file holds {}", label,
                            n > size - kHeaderBytes ? "truncated" : "trailing bytes", n, size - kHeaderBytes));
  const uint64_t got = hash64(data + kHeaderBytes, n);
  if (got != sum)
    throw Error(fmt::format("{}: corrupted: payload checksum {:016x}, the header says {:016x}", label, got, sum));
  kv::ByteReader r(data + kHeaderBytes, n, label);
  return Context::Data::parse(r);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(fmt::format("context file {}: cannot open: {}", path, std::strerror(errno)));
  std::vector<uint8_t> buf;
  uint8_t chunk[1 << 16];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), f)) > 0) buf.insert(buf.end(), chunk, chunk + got);
  const bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) throw Error(fmt::format("context file {}: read error", path));
  return buf;
}

}  // namespace

ContextInfo inspect_image(const uint8_t* data, size_t size, const std::string& label) {
  auto d = parse_image(data, size, label);
  d->file_bytes = size;
  return d->info();
}

}  // namespace context

Context Context::build(const Model& model, std::vector<Token> tokens, const ContextOptions& opt) {
  std::unique_ptr<PressImpl> press = make_press_impl(opt.press, opt.ratio);
  const std::string why = press->storage_refusal();
  if (!why.empty()) throw Error(fmt::format("press {} cannot be stored as a context: {}", press->describe(), why));
  RequestOptions ro;
  ro.session = opt.session;
  ro.chunk_size = opt.chunk_size;
  ro.n_predict = 0;
  Request req(model, *press, ro);
  req.set_prompt_tokens(std::move(tokens));
  req.prefill();
  if (req.finished()) throw Error(fmt::format("context build stopped: {}", finish_reason_name(req.finish_reason())));
  return context::from_request(model, req, press->describe(), press->report(), opt.chunk_size, true);
}

Context context::from_request(const Model& model, Request& req, const std::string& press,
                              const std::string& press_report, int chunk_size, bool take_cache) {
  if (!req.prefilled()) throw Error("a context is made from a request whose prompt is in");
  if (req.logits().size() != static_cast<size_t>(model.hparams().n_vocab))
    throw Error("a context is made from a request with next-token logits (none after a rewind)");
  auto d = std::make_shared<Context::Data>();
  d->fp = Fingerprint::of(model);
  d->press = press;
  d->chunk_size = chunk_size;
  d->press_report = press_report;
  d->next_position = req.position();
  // The tokens the cache covers: prompt, then the generated tokens run so far (the last sampled
  // one is not run until the next step).
  const size_t n = static_cast<size_t>(req.position());
  for (const std::vector<Token>* part : {&req.context_tokens(), &req.question_tokens(), &req.generated()})
    for (Token t : *part)
      if (d->tokens.size() < n) d->tokens.push_back(t);
  if (d->tokens.size() != n)
    throw Error(fmt::format("the request ran {} tokens but holds {}", n, d->tokens.size()));
  d->logits = req.logits();
  const RequestStats rs = req.stats();  // before the cache moves out: stats() reads it
  d->cache = take_cache ? std::move(req.session().cache()) : req.cache();
  d->cache.shrink_to_fit();  // a stored context is kept long: no room to grow
  d->cache.share();          // requests answering from it read its entries in place
  d->tokens.shrink_to_fit();
  // Figures that follow from the cache are computed from it, as the reader does.
  RequestStats& st = d->stats;
  st.prefill_seconds = rs.prefill_seconds;
  st.press_seconds = rs.press_seconds;
  st.peak_kv_bytes = rs.peak_kv_bytes;
  const KVCache& c = d->cache;
  st.context_tokens = static_cast<int>(n);
  st.entries_total = n * static_cast<size_t>(c.n_layer()) * c.n_head_kv();
  st.full_f16_bytes = c.full_f16_bytes(n);
  st.entries_kept = c.entries();
  for (int l = 0; l < c.n_layer(); ++l) st.kept_per_layer.push_back(c.entries(l));
  st.kv_bytes = c.bytes();
  st.shared_bytes = c.shared_bytes();
  return Context(std::move(d));
}

Context Context::build(const Model& model, const std::string& text, const ContextOptions& opt) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<Token> ids = tok.encode(text, tok.add_bos_default(), false);
  const size_t n_text = ids.size() - ((!ids.empty() && ids[0] == tok.bos() && tok.add_bos_default()) ? 1 : 0);
  if (text.empty() || n_text == 0) throw Error("empty context: the text has no tokens");
  Context c = build(model, std::move(ids), opt);
  std::const_pointer_cast<Data>(c.d_)->text = text;
  return c;
}

std::string Context::image() const { return context::file_image(d_->payload()); }

Context Context::from_image(const Model& model, const void* data, size_t size, const std::string& label) {
  return context::load_image(model, static_cast<const uint8_t*>(data), size, label);
}

uint64_t Context::fingerprint(const Model& model) { return Fingerprint::of(model).digest(); }

void Context::save(const std::string& path) const {
  const std::string image = this->image();
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(fmt::format("context file {}: cannot write {}: {}", path, tmp, std::strerror(errno)));
  bool ok = std::fwrite(image.data(), 1, image.size(), f) == image.size();
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(::fileno(f)) == 0 && ok;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("context file {}: write failed: {}", path, std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("context file {}: cannot rename {} onto it: {}", path, tmp, std::strerror(e)));
  }
  std::const_pointer_cast<Data>(d_)->file_bytes = image.size();
}

Context Context::load(const Model& model, const std::string& path) {
  const std::vector<uint8_t> buf = context::read_file(path);
  return context::load_image(model, buf.data(), buf.size(), fmt::format("context file {}", path));
}

Context context::load_image(const Model& model, const uint8_t* data, size_t size, const std::string& label) {
  auto d = parse_image(data, size, label);
  const std::string diff = d->fp.differs(Fingerprint::of(model));
  if (!diff.empty()) throw Error(fmt::format("{} was built with another model: its {}", label, diff));
  d->file_bytes = size;
  return Context(std::move(d));
}

ContextInfo Context::inspect(const std::string& path) {
  const std::vector<uint8_t> buf = context::read_file(path);
  return context::inspect_image(buf.data(), buf.size(), fmt::format("context file {}", path));
}

ContextInfo Context::info() const { return d_->info(); }
const KVCache& Context::cache() const { return d_->cache; }
const std::vector<Token>& Context::tokens() const { return d_->tokens; }
const std::string& Context::text() const { return d_->text; }

std::unique_ptr<Request> Context::request(const Model& model, std::vector<Token> question, RequestOptions opt) const {
  const std::string diff = d_->fp.differs(Fingerprint::of(model));
  if (!diff.empty()) throw Error(fmt::format("the stored context was built with another model: its {}", diff));
  if (opt.chunk_size > 0)
    throw Error(fmt::format("a stored context is already compressed: chunk size {} does not apply", opt.chunk_size));
  if (opt.auto_budget.active())
    throw Error("a stored context is already compressed: auto-budget (target KL, KV budget) does not apply");
  const Segment& s = d_->cache.seg(0, 0);
  opt.session.key_codec = s.key_codec();
  opt.session.value_codec = s.value_codec();
  opt.session.kv_quant = s.quant();
  // The press acted when the context was built; storable presses do nothing at decode (see
  // Press::storage_refusal), so the question and the answer run with none.
  auto req = std::make_unique<Request>(model, make_press_impl("none", 0.0), std::move(opt));
  req->set_prompt_cached(d_->tokens, d_->cache, d_->next_position, d_->logits, d_->stats, std::move(question));
  return req;
}

GenerateResult generate(const Model& model, const Context& context, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text) {
  if (!opt.context.empty() || !opt.context_tokens.empty())
    throw Error("generate from a stored context: the context is the stored one; give only the question");
  std::vector<Token> q;
  if (!opt.question.empty()) q = model.tokenizer().encode(opt.question, false, false);
  std::unique_ptr<Request> req = context.request(model, std::move(q), opt);
  return run::run_to_end(*req, on_text);
}

}  // namespace kvslim
