// trim_vocab: writes a small copy of a llama.cpp test vocabulary (ggml-vocab-NAME.gguf, 0.7-4 MB)
// that encodes the given test strings to the same tokens, so the test suite can ship it in
// tests/data instead of reading the full file from outside the repository.
//
//   trim_vocab IN.gguf OUT.gguf STRINGS.inp [EXTRA.inp ...]
//
// STRINGS files use llama.cpp's test-tokenizer-0 layout (strings separated by
// "\n__ggml_vocab_test__\n"). Kept: every token whose decoded text occurs in some string (alone, with
// a leading space, or across the joins of the strings), every non-normal token (control, unknown,
// user-defined, byte) and every token named by a *_token_id key; and the merges whose two parts and
// result are all kept. Why this is exact: during BPE or SPM encoding of a string, every candidate
// pair and every merge result is a substring of that string, so the kept merges and tokens are
// exactly the candidates the full vocabulary would consider, in the same order.
//
// Token ids change (kept tokens are renumbered in their original order); the new file records the
// original id of each kept token in `kvslim.trim.original_ids` (i32 array, new id -> original id),
// so tests compare against llama.cpp's original ids unchanged.
//
// Build (after building kvslim_lib in build/):
//   g++ -std=gnu++20 -O2 -Iinclude -Isrc tools/trim_vocab.cpp -o build/trim_vocab \
//       -Wl,--whole-archive build/libkvslim.a -Wl,--no-whole-archive \
//       $(pkg-config --libs openblas libpcre2-8) -lfmt -lpthread
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"

using namespace kvslim;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_cases(const std::string& inp) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  for (size_t pos = 0; pos < inp.size();) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      out.push_back(inp.substr(pos));
      break;
    }
    out.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

bool is_id_key(const std::string& key) {
  const std::string suffix = "_token_id";
  return key.rfind("tokenizer.ggml.", 0) == 0 && key.size() > suffix.size() &&
         key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int run(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: trim_vocab IN.gguf OUT.gguf STRINGS.inp [EXTRA.inp ...]\n");
    return 2;
  }
  auto in = GGUFFile::open(argv[1]);
  auto tok = Tokenizer::from_gguf(*in);

  std::vector<std::string> strings;
  for (int i = 3; i < argc; ++i)
    for (std::string& s : split_cases(read_all(argv[i]))) strings.push_back(std::move(s));
  // Each string alone and after a space (the SPM space prefix), then all of them joined by newlines
  // twice over (the long-prompt test encodes that concatenation).
  std::string hay;
  std::string joined;
  for (const std::string& s : strings) {
    hay += s + "\x01 " + s + "\x01";
    joined += s + "\n";
  }
  hay += joined + joined;

  const std::vector<std::string> texts = in->get_string_array("tokenizer.ggml.tokens");
  const size_t n = texts.size();
  std::vector<int32_t> types;
  if (in->has("tokenizer.ggml.token_type")) types = in->get_int_array("tokenizer.ggml.token_type");
  std::set<int64_t> named;
  for (const auto& [key, value] : in->metadata())
    if (is_id_key(key)) named.insert(in->get_int(key));

  std::vector<int32_t> kept;  // original ids, ascending
  std::map<int64_t, int32_t> new_id;
  std::set<std::string> kept_texts;
  for (size_t i = 0; i < n; ++i) {
    const Token id = static_cast<Token>(i);
    const int32_t type = types.empty() ? 1 : types[i];
    const std::string p = tok->piece(id);
    const bool special = type != 1 && type != 0 && type != 5;
    if (special || named.count(static_cast<int64_t>(i)) || (!p.empty() && hay.find(p) != std::string::npos)) {
      new_id[static_cast<int64_t>(i)] = static_cast<int32_t>(kept.size());
      kept.push_back(static_cast<int32_t>(i));
      kept_texts.insert(texts[i]);
    }
  }

  GGUFWriter w;
  for (const auto& [key, value] : in->metadata()) {
    if (key == "tokenizer.ggml.tokens") {
      std::vector<std::string> v;
      for (int32_t i : kept) v.push_back(texts[static_cast<size_t>(i)]);
      w.set(key, GGUFValue::str_array(std::move(v)));
    } else if (key == "tokenizer.ggml.scores") {
      const std::vector<float> all = in->get_float_array(key);
      std::vector<float> v;
      for (int32_t i : kept) v.push_back(all[static_cast<size_t>(i)]);
      w.set(key, GGUFValue::f32_array(std::move(v)));
    } else if (key == "tokenizer.ggml.token_type") {
      std::vector<int32_t> v;
      for (int32_t i : kept) v.push_back(types[static_cast<size_t>(i)]);
      w.set(key, GGUFValue::i32_array(std::move(v)));
    } else if (key == "tokenizer.ggml.merges") {
      std::vector<std::string> v;
      for (const std::string& m : in->get_string_array(key)) {
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) continue;
        const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
        if (kept_texts.count(a) && kept_texts.count(b) && kept_texts.count(a + b)) v.push_back(m);
      }
      w.set(key, GGUFValue::str_array(std::move(v)));
    } else if (is_id_key(key)) {
      const int64_t old = in->get_int(key);
      auto it = new_id.find(old);
      // Out-of-range ids mean "none" and stay as they are.
      w.set(key, it == new_id.end() ? value : GGUFValue::u32(static_cast<uint32_t>(it->second)));
    } else {
      w.set(key, value);
    }
  }
  w.set("kvslim.trim.original_ids", GGUFValue::i32_array(kept));
  w.set("kvslim.trim.original_n_vocab", GGUFValue::u32(static_cast<uint32_t>(n)));
  w.write(argv[2]);
  std::fprintf(stderr, "%s: kept %zu of %zu tokens\n", argv[2], kept.size(), n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trim_vocab: %s\n", e.what());
    return 1;
  }
}
