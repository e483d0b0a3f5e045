// SentencePiece-style tokenizer (`tokenizer.ggml.model` = "llama"), llama.cpp's algorithm:
// spaces become U+2581, the text is split into UTF-8 characters, and the adjacent pair whose
// concatenation is the highest-scoring vocabulary entry is merged until no pair is in the
// vocabulary. Characters that never formed a token fall back to <0xXX> byte tokens.
#include <queue>

#include "tokenizer/internal.h"

namespace kvslim::tok {

namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

struct Symbol {
  int prev, next;
  size_t start, n;  // byte range in the escaped text; n == 0 once merged away
};

struct Bigram {
  int left, right;
  float score;
  size_t size;
};

// Highest score first; among equal scores the leftmost pair.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmTokenizer : public VocabTokenizer {
 public:
  explicit SpmTokenizer(Vocab v) : VocabTokenizer(std::move(v)) {
    for (int b = 0; b < 256; ++b) {
      static const char* hex = "0123456789ABCDEF";
      const char buf[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
      Token id = v_.find(buf);
      if (id < 0) id = v_.find(std::string(1, static_cast<char>(b)));
      byte_token_[b] = id;
    }
  }

  std::vector<Token> encode(const std::string& text, bool add_bos, bool parse_special) const override {
    std::vector<Token> out;
    if (add_bos && v_.bos >= 0) out.push_back(v_.bos);
    bool prev_special = true;  // the space prefix goes at the start and after special tokens
    std::string buf;
    for (const Fragment& fr : partition_special(v_, text, parse_special)) {
      if (fr.token >= 0) {
        out.push_back(fr.token);
        prev_special = true;
        continue;
      }
      buf.clear();
      if (v_.add_space_prefix && prev_special) buf += kSpace;
      for (size_t i = fr.begin; i < fr.end; ++i) {
        if (text[i] == ' ') buf += kSpace;
        else buf.push_back(text[i]);
      }
      encode_escaped(buf, out);
      prev_special = false;
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
      case kByte:
        return byte_of(td.text);
      default: {
        std::string s;
        s.reserve(td.text.size());
        for (size_t i = 0; i < td.text.size();) {
          if (td.text.compare(i, kSpace.size(), kSpace) == 0) {
            s.push_back(' ');
            i += kSpace.size();
          } else {
            s.push_back(td.text[i++]);
          }
        }
        return s;
      }
    }
  }

  std::string decode(const std::vector<Token>& tokens) const override {
    std::string out;
    bool strip = v_.add_space_prefix;
    for (Token t : tokens) {
      if (v_.valid(t) && v_.is_special(t)) {
        out += piece(t);
        strip = v_.add_space_prefix;  // the encoder prefixed a space after it
        continue;
      }
      std::string p = piece(t);
      if (strip && !p.empty() && p[0] == ' ') p.erase(0, 1);
      strip = false;
      out += p;
    }
    return out;
  }

 private:
  // "<0xAB>" -> the byte 0xAB; anything else is returned as it is.
  static std::string byte_of(const std::string& text) {
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' && hex(text[3]) >= 0 &&
        hex(text[4]) >= 0)
      return std::string(1, static_cast<char>(hex(text[3]) * 16 + hex(text[4])));
    return text;
  }

  void encode_escaped(const std::string& text, std::vector<Token>& out) const {
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
      size_t n = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
      int idx = static_cast<int>(sym.size());
      sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
      off += n;
    }
    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    std::string_view tv(text);
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      std::string_view s = tv.substr(sym[l].start, sym[l].n + sym[r].n);
      Token id = v_.find(s);
      if (id < 0) return;
      queue.push({l, r, v_.tokens[id].score, s.size()});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      Bigram b = queue.top();
      queue.pop();
      Symbol& L = sym[b.left];
      Symbol& R = sym[b.right];
      if (L.n == 0 || R.n == 0 || L.n + R.n != b.size) continue;  // stale
      L.n += R.n;
      R.n = 0;
      L.next = R.next;
      if (R.next >= 0) sym[R.next].prev = b.left;
      try_add(L.prev, b.left);
      try_add(b.left, L.next);
    }
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
      std::string_view s = tv.substr(sym[i].start, sym[i].n);
      Token id = v_.find(s);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // Byte fallback; a vocabulary without byte tokens gets one unknown token instead.
      bool bytes = true;
      for (unsigned char c : s) bytes = bytes && byte_token_[c] >= 0;
      if (bytes) {
        for (unsigned char c : s) out.push_back(byte_token_[c]);
      } else if (v_.unk >= 0) {
        out.push_back(v_.unk);
      }
    }
  }

  Token byte_token_[256];
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm(Vocab v) { return std::make_unique<SpmTokenizer>(std::move(v)); }

}  // namespace kvslim::tok
