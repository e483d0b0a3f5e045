// libFuzzer target: encode and decode arbitrary bytes with the bundled vocabularies: the SPM
// tokenizer of models/stories260K.gguf and the BPE tokenizers of GPT-2 and Llama-3-style
// (DeepSeek) vocabularies from tests/data/vocab. The first byte picks the tokenizer and whether
// special tokens are parsed. Checks: no crash, hang or sanitizer report, no exception other than
// kvslim::Error, and every id inside the vocabulary (decoded again).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"

#ifndef KVSLIM_SOURCE_DIR
#error "KVSLIM_SOURCE_DIR must name the source tree (the vocabularies are read from it)"
#endif

using namespace kvslim;

namespace {

struct Loaded {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tok;
};

std::vector<Loaded>& tokenizers() {
  static std::vector<Loaded> all = [] {
    std::vector<Loaded> v;
    const std::string root = KVSLIM_SOURCE_DIR;
    for (const char* path : {"/models/stories260K.gguf", "/tests/data/vocab/ggml-vocab-llama-spm.gguf",
                             "/tests/data/vocab/ggml-vocab-gpt-2.gguf", "/tests/data/vocab/ggml-vocab-deepseek-llm.gguf"}) {
      Loaded l;
      l.file = GGUFFile::open(root + path);
      l.tok = Tokenizer::from_gguf(*l.file);
      v.push_back(std::move(l));
    }
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  auto& all = tokenizers();
  const Loaded& t = all[data[0] % all.size()];
  const bool special = (data[0] / all.size()) & 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<Token> ids;
  try {
    ids = t.tok->encode(text, (data[0] >> 4) & 1, special);
  } catch (const Error&) {
    return 0;
  }
  for (Token id : ids)
    if (id < 0 || id >= t.tok->n_vocab()) std::abort();
  try {
    (void)t.tok->decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
