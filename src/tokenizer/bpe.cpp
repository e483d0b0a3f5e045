// Byte-level BPE tokenizer (`tokenizer.ggml.model` = "gpt2"), llama.cpp's algorithm: the text is
// split into words by the pre-tokenizer regexes that `tokenizer.ggml.pre` selects, each word's
// bytes are mapped to printable characters (GPT-2's byte-to-unicode table), and adjacent symbols
// are merged in the order of `tokenizer.ggml.merges` (lowest rank first).
#include <queue>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "tokenizer/internal.h"

namespace kvslim::tok {

namespace {

// ---- pre-tokenizer regexes (facts from llama.cpp's llama-vocab.cpp) ----

// GPT-2. The trailing `\s+` is implied in llama.cpp, which keeps unmatched text as words.
const char* const kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Cased letters (Unicode LC) as DeepSeek's tokenizer lists them.
const char* const kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
const char* const kDeepseekPunct = R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
const char* const kCjkHangul = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
const char* const kPoro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
// Original tokenizer.json regexes; PCRE2 handles the letter subcategories and (?i:) directly.
const char* const kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kDeepseekV3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_one_of(const std::string& s, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (s == n) return true;
  return false;
}

// ---- GPT-2 byte <-> unicode mapping ----

struct ByteMap {
  std::string to_utf8[256];  // byte -> UTF-8 of its printable stand-in
  int from_cp[512];          // stand-in code point -> byte, -1 if none
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(to_utf8[b], cp);
      from_cp[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

struct Symbol {
  int prev, next;
  size_t start, n;  // byte range in the mapped word; n == 0 once merged away
};

struct Bigram {
  int left, right;
  int rank;
  size_t left_n, right_n;  // sizes when queued, to detect stale entries
};

// Lowest rank first; among equal ranks the leftmost pair.
struct BigramGreater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class BpeTokenizer : public VocabTokenizer {
 public:
  BpeTokenizer(Vocab v, const GGUFFile& f, PreTokenizer pre)
      : VocabTokenizer(std::move(v)), split_(pre.regexes), ignore_merges_(pre.ignore_merges) {
    const std::string key = "tokenizer.ggml.merges";
    if (!f.has(key)) throw Error(fmt::format("{}: BPE vocabulary without '{}'", f.path(), key));
    std::vector<std::string> merges = f.get_string_array(key);
    ranks_.reserve(merges.size() * 2);
    for (size_t i = 0; i < merges.size(); ++i) {
      // "left right"; the separator is searched from the second byte, as in llama.cpp.
      size_t sp = merges[i].find(' ', 1);
      if (sp == std::string::npos) continue;
      ranks_.emplace(std::move(merges[i]), static_cast<int>(i));
    }
  }

  std::vector<Token> encode(const std::string& text, bool add_bos, bool parse_special) const override {
    std::vector<Token> out;
    if (add_bos && v_.bos >= 0) out.push_back(v_.bos);
    StringMap<std::vector<Token>> cache;  // word -> tokens, for this call
    for (const Fragment& fr : partition_special(v_, text, parse_special)) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
        continue;
      }
      std::string clean = sanitize_utf8(std::string_view(text).substr(fr.begin, fr.end - fr.begin));
      for (auto [b, e] : split_.split(clean)) {
        std::string_view word(clean.data() + b, e - b);
        auto it = cache.find(word);
        if (it == cache.end()) it = cache.emplace(std::string(word), encode_word(word)).first;
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
    }
    return out;
  }

  std::string piece(Token t) const override {
    if (!v_.valid(t)) return {};
    const TokenData& td = v_.tokens[t];
    switch (td.type) {
      case kControl:
      case kUnknown:
        return {};
      case kUserDefined:
        return td.text;
      default: {
        // Undo the byte mapping; characters outside it are kept as they are.
        const ByteMap& bm = byte_map();
        std::string s;
        const std::string& x = td.text;
        for (size_t i = 0; i < x.size();) {
          size_t n = std::min(utf8_len(static_cast<unsigned char>(x[i])), x.size() - i);
          uint32_t cp = decode_cp(x, i, n);
          if (cp < 512 && bm.from_cp[cp] >= 0) s.push_back(static_cast<char>(bm.from_cp[cp]));
          else s.append(x, i, n);
          i += n;
        }
        return s;
      }
    }
  }

  std::string decode(const std::vector<Token>& tokens) const override {
    std::string out;
    for (Token t : tokens) out += piece(t);
    return out;
  }

 private:
  static uint32_t decode_cp(const std::string& s, size_t i, size_t n) {
    auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
    switch (n) {
      case 1: return b(0);
      case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
      case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
      default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    }
  }

  int rank(std::string_view a, std::string_view b, std::string& key) const {
    key.assign(a);
    key.push_back(' ');
    key.append(b);
    auto it = ranks_.find(std::string_view(key));
    return it == ranks_.end() ? -1 : it->second;
  }

  std::vector<Token> encode_word(std::string_view raw) const {
    std::vector<Token> out;
    const ByteMap& bm = byte_map();
    std::string word;
    word.reserve(raw.size() * 2);
    for (unsigned char c : raw) word += bm.to_utf8[c];

    if (ignore_merges_) {
      Token id = v_.find(word);
      if (id >= 0) {
        out.push_back(id);
        return out;
      }
    }
    std::vector<Symbol> sym;
    for (size_t off = 0; off < word.size();) {
      size_t n = std::min(utf8_len(static_cast<unsigned char>(word[off])), word.size() - off);
      int idx = static_cast<int>(sym.size());
      sym.push_back({idx - 1, off + n == word.size() ? -1 : idx + 1, off, n});
      off += n;
    }
    std::string_view wv(word);
    std::string key;
    std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue;
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      int rk = rank(wv.substr(sym[l].start, sym[l].n), wv.substr(sym[r].start, sym[r].n), key);
      if (rk >= 0) queue.push({l, r, rk, sym[l].n, sym[r].n});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      Bigram b = queue.top();
      queue.pop();
      Symbol& L = sym[b.left];
      Symbol& R = sym[b.right];
      if (L.n != b.left_n || R.n != b.right_n || L.next != b.right) continue;  // stale
      L.n += R.n;
      R.n = 0;
      L.next = R.next;
      if (R.next >= 0) sym[R.next].prev = b.left;
      try_add(L.prev, b.left);
      try_add(b.left, L.next);
    }
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
      std::string_view s = wv.substr(sym[i].start, sym[i].n);
      Token id = v_.find(s);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // No token for the merged text: fall back to its characters (each a byte stand-in).
      for (size_t k = 0; k < s.size();) {
        size_t n = std::min(utf8_len(static_cast<unsigned char>(s[k])), s.size() - k);
        Token c = v_.find(s.substr(k, n));
        if (c >= 0) out.push_back(c);
        k += n;
      }
    }
    return out;
  }

  RegexSplitter split_;
  bool ignore_merges_;
  StringMap<int> ranks_;
};

}  // namespace

PreTokenizer pre_tokenizer_for(const std::string& pre) {
  PreTokenizer p;
  if (pre.empty() || pre == "default") {
    p.regexes = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else if (is_one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                             "lfm2"})) {
    p.regexes = {kLlama3};
    p.ignore_merges = true;
    p.add_bos = true;
  } else if (is_one_of(pre, {"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) {
    p.regexes = {kLlama3};
  } else if (pre == "deepseek-llm") {
    p.regexes = {"[\r\n]", kDeepseekLlmLetters, kDeepseekPunct, R"(\s+$)", kCjkHangul, R"(\p{N}+)"};
  } else if (pre == "deepseek-coder") {
    p.regexes = {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjkHangul, R"(\p{N})"};
  } else if (pre == "deepseek-v3") {
    p.regexes = {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseekV3};
  } else if (pre == "falcon") {
    p.regexes = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"};
  } else if (is_one_of(pre, {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})) {
    p.regexes = {R"(\p{N})", kGpt2};
  } else if (is_one_of(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                             "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4",
                             "trillion", "granite-docling", "a.x-4.0", "mellum", "modern-bert"})) {
    p.regexes = {kGpt2};
  } else if (is_one_of(pre, {"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez"})) {
    p.regexes = {kQwen2};
  } else if (is_one_of(pre, {"poro-chat", "bloom", "gpt3-finnish"})) {
    p.regexes = {kPoro};
  } else if (pre == "viking") {
    p.regexes = {kPoro, R"(\p{N})"};
  } else if (pre == "tekken") {
    p.regexes = {kTekken};
    p.ignore_merges = true;
    p.add_bos = true;
  } else if (is_one_of(pre, {"gpt-4o", "llama4"})) {
    p.regexes = {kGpt4o};
  } else {
    throw Error(fmt::format("tokenizer: unknown pre-tokenizer '{}' (tokenizer.ggml.pre)", printable(pre)));
  }
  return p;
}

std::unique_ptr<Tokenizer> make_bpe(Vocab v, const GGUFFile& f, PreTokenizer pre) {
  return std::make_unique<BpeTokenizer>(std::move(v), f, std::move(pre));
}

}  // namespace kvslim::tok
