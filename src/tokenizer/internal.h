#pragma once
// Private pieces shared by the tokenizer implementations: the vocabulary as loaded from GGUF,
// special-token partitioning, UTF-8 helpers and the PCRE2-based pre-tokenizer.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvslim/tokenizer.h"

namespace kvslim::tok {

/// Token types as stored in `tokenizer.ggml.token_type` (llama.cpp / SentencePiece numbering).
enum TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

struct TokenData {
  std::string text;
  float score = 0.0f;
  int32_t type = kNormal;
  bool lstrip = false;  ///< when partitioning, drop whitespace just left of this token
  bool rstrip = false;  ///< ... and just right of it
};

/// Hash for string keys that also accepts string_view lookups without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

/// The vocabulary and the special-token facts shared by both algorithms.
struct Vocab {
  std::string model;  ///< tokenizer.ggml.model
  std::string pre;    ///< tokenizer.ggml.pre (may be empty)
  std::vector<TokenData> tokens;
  StringMap<Token> index;
  Token bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::vector<Token> specials;  ///< control / user-defined / unknown tokens, longest text first
  std::set<Token> eog;

  /// Id of `text`, or -1.
  Token find(std::string_view text) const {
    auto it = index.find(text);
    return it == index.end() ? -1 : it->second;
  }
  bool valid(Token t) const { return t >= 0 && static_cast<size_t>(t) < tokens.size(); }
  int32_t type(Token t) const { return tokens[t].type; }
  bool is_special(Token t) const {
    int32_t ty = tokens[t].type;
    return ty == kControl || ty == kUserDefined || ty == kUnknown;
  }
};

/// Defaults that depend on the algorithm, applied before metadata overrides.
struct VocabDefaults {
  Token bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  bool add_space_prefix = false;
};

/// Reads tokens, scores, types and special ids from `f`. Throws kvslim::Error on missing or
/// inconsistent arrays.
Vocab load_vocab(const GGUFFile& f, const std::string& model, const std::string& pre, const VocabDefaults& d);

/// A piece of the input: either an already-decided token (`token >= 0`) or raw text [begin, end).
struct Fragment {
  Token token = -1;
  size_t begin = 0, end = 0;
};

/// Splits `text` around special-token texts, longest token first (llama.cpp's order). Control
/// and unknown tokens take part only when `parse_special`; user-defined ones always do.
std::vector<Fragment> partition_special(const Vocab& v, std::string_view text, bool parse_special);

// ---- UTF-8 ----

/// Length of the UTF-8 sequence that starts with byte `c` (1 for stray continuation bytes).
inline size_t utf8_len(unsigned char c) {
  static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}
/// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, uint32_t cp);
/// Copy of `s` in which every byte that does not start a valid UTF-8 sequence is replaced by
/// U+FFFD (as llama.cpp does before pre-tokenizing).
std::string sanitize_utf8(std::string_view s);

// ---- regex pre-tokenizer ----

/// Applies a list of regexes in sequence, as llama.cpp's unicode_regex_split does: each regex
/// splits every current word into its matches and the text between matches (both kept), and
/// runs on each word separately (so `$` and lookaheads see the word's end).
class RegexSplitter {
 public:
  explicit RegexSplitter(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  /// Byte ranges of the words of `text` (valid UTF-8), in order, covering all of it.
  std::vector<std::pair<size_t, size_t>> split(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- the two algorithms ----

/// Behaviour switches a `pre` name selects for byte-level BPE.
struct PreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  ///< a word that is itself a token is emitted whole (llama3)
  bool add_bos = false;        ///< default for add_bos_token
};
/// The pre-tokenizer for `pre` (empty means "default"); throws kvslim::Error naming an unknown one.
PreTokenizer pre_tokenizer_for(const std::string& pre);

std::unique_ptr<Tokenizer> make_spm(Vocab v);
std::unique_ptr<Tokenizer> make_bpe(Vocab v, const GGUFFile& f, PreTokenizer pre);

/// Shared accessors; subclasses implement encode/piece/decode.
class VocabTokenizer : public Tokenizer {
 public:
  explicit VocabTokenizer(Vocab v) : v_(std::move(v)) {}
  int n_vocab() const override { return static_cast<int>(v_.tokens.size()); }
  Token bos() const override { return v_.bos; }
  Token eos() const override { return v_.eos; }
  Token eot() const override { return v_.eot; }
  Token unk() const override { return v_.unk; }
  bool add_bos_default() const override { return v_.add_bos; }
  bool add_eos_default() const override { return v_.add_eos; }
  bool is_eog(Token t) const override { return v_.eog.count(t) > 0; }
  bool is_control(Token t) const override {
    return v_.valid(t) && (v_.type(t) == kControl || v_.type(t) == kUnknown);
  }
  std::string token_text(Token t) const override { return v_.valid(t) ? v_.tokens[t].text : std::string(); }
  Token find_token(const std::string& text) const override { return v_.find(text); }
  std::string model() const override { return v_.model; }
  std::string pre() const override { return v_.pre; }

 protected:
  Vocab v_;
};

}  // namespace kvslim::tok
