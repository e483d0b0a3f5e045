// Vocabulary loading from GGUF metadata, special-token partitioning and UTF-8 helpers.
#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "tokenizer/internal.h"

namespace kvslim::tok {

namespace {

constexpr const char* kTokens = "tokenizer.ggml.tokens";
constexpr const char* kScores = "tokenizer.ggml.scores";
constexpr const char* kTypes = "tokenizer.ggml.token_type";

// Token texts that end generation (llama.cpp's list, minus model-specific oddities).
const char* const kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
};
// Texts taken as the end-of-turn token when metadata names none.
const char* const kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};

// Reads an optional special-token id; out-of-range values (e.g. 0xFFFFFFFF for "none") leave
// `id` as it was.
void read_special_id(const GGUFFile& f, const std::string& key, size_t n, Token& id) {
  if (!f.has(key)) return;
  int64_t v = f.get_int(key);
  if (v >= 0 && static_cast<uint64_t>(v) < n) id = static_cast<Token>(v);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Vocab load_vocab(const GGUFFile& f, const std::string& model, const std::string& pre, const VocabDefaults& d) {
  Vocab v;
  v.model = model;
  v.pre = pre;
  std::vector<std::string> texts = f.get_string_array(kTokens);
  const size_t n = texts.size();
  if (n == 0) throw Error(fmt::format("{}: '{}' is empty", f.path(), kTokens));
  std::vector<float> scores;
  if (f.has(kScores)) {
    scores = f.get_float_array(kScores);
    if (scores.size() != n)
      throw Error(fmt::format("{}: '{}' has {} entries but '{}' has {}", f.path(), kScores, scores.size(), kTokens, n));
  }
  std::vector<int32_t> types;
  if (f.has(kTypes)) {
    types = f.get_int_array(kTypes);
    if (types.size() != n)
      throw Error(fmt::format("{}: '{}' has {} entries but '{}' has {}", f.path(), kTypes, types.size(), kTokens, n));
  }

  v.tokens.resize(n);
  v.index.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    TokenData& td = v.tokens[i];
    td.text = std::move(texts[i]);
    td.score = scores.empty() ? 0.0f : scores[i];
    td.type = types.empty() ? kNormal : types[i];
    // An empty string can never be matched; a duplicate keeps its first id.
    if (!td.text.empty()) v.index.emplace(td.text, static_cast<Token>(i));
  }

  auto in_range = [&](Token t) { return t >= 0 && static_cast<size_t>(t) < n ? t : Token(-1); };
  v.bos = in_range(d.bos);
  v.eos = in_range(d.eos);
  v.unk = in_range(d.unk);
  read_special_id(f, "tokenizer.ggml.bos_token_id", n, v.bos);
  read_special_id(f, "tokenizer.ggml.eos_token_id", n, v.eos);
  read_special_id(f, "tokenizer.ggml.eot_token_id", n, v.eot);
  read_special_id(f, "tokenizer.ggml.eom_token_id", n, v.eom);
  read_special_id(f, "tokenizer.ggml.unknown_token_id", n, v.unk);
  read_special_id(f, "tokenizer.ggml.padding_token_id", n, v.pad);

  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token", d.add_bos);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", d.add_space_prefix);

  // End-of-turn token by its text when metadata names none; end-of-generation set. Tokens found
  // this way are treated as control tokens (llama.cpp does the same for mislabelled vocabularies).
  if (v.eot < 0) {
    for (const char* t : kEotTexts) {
      Token id = v.find(t);
      if (id >= 0) {
        v.eot = id;
        break;
      }
    }
  }
  for (const char* t : kEogTexts) {
    Token id = v.find(t);
    if (id >= 0) v.eog.insert(id);
  }
  for (Token id : {v.eos, v.eot, v.eom})
    if (id >= 0) v.eog.insert(id);
  for (Token id : v.eog)
    if (v.tokens[id].type == kNormal || v.tokens[id].type == kUndefined) v.tokens[id].type = kControl;

  for (size_t i = 0; i < n; ++i)
    if (v.is_special(static_cast<Token>(i)) && !v.tokens[i].text.empty()) v.specials.push_back(static_cast<Token>(i));
  std::stable_sort(v.specials.begin(), v.specials.end(),
                   [&](Token a, Token b) { return v.tokens[a].text.size() > v.tokens[b].text.size(); });

  // Phi-3 vocabularies eat whitespace to the right of special tokens (llama.cpp keys this on the
  // model name, as the GGUF carries no per-token attributes).
  std::string name = lower(f.has("general.name") ? f.get_string("general.name") : std::string());
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (Token id : v.specials) v.tokens[id].rstrip = true;
    if (Token id = v.find("</s>"); id >= 0) v.tokens[id].rstrip = true;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
      if (Token id = v.find(t); id >= 0) v.tokens[id].rstrip = false;
  }
  return v;
}

std::vector<Fragment> partition_special(const Vocab& v, std::string_view text, bool parse_special) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (Token id : v.specials) {
    const TokenData& td = v.tokens[id];
    if (!parse_special && td.type != kUserDefined) continue;
    const std::string& s = td.text;
    // Cheap rejection: most special texts do not occur at all.
    if (text.find(s) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& fr : frags) {
      if (fr.token >= 0) {
        next.push_back(fr);
        continue;
      }
      std::string_view window = text.substr(0, fr.end);
      size_t pos = fr.begin;
      while (true) {
        size_t m = window.find(s, pos);
        if (m == std::string_view::npos) break;
        size_t left_end = m;
        if (td.lstrip)
          while (left_end > pos && std::isspace(static_cast<unsigned char>(text[left_end - 1]))) --left_end;
        if (left_end > pos) next.push_back({-1, pos, left_end});
        next.push_back({id, 0, 0});
        pos = m + s.size();
        if (td.rstrip)
          while (pos < fr.end && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
      }
      if (pos < fr.end) next.push_back({-1, pos, fr.end});
    }
    frags.swap(next);
  }
  return frags;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there do not form one
// (overlong forms, surrogates and values past U+10FFFF count as invalid).
size_t valid_utf8_at(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  return len;
}

}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t len = valid_utf8_at(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace kvslim::tok
