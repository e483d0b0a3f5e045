// Tokenizer::from_gguf: picks the algorithm from `tokenizer.ggml.model`.
#include <fmt/format.h>

#include "kvslim/error.h"
#include "tokenizer/internal.h"

namespace kvslim {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GGUFFile& f) {
  const std::string key = "tokenizer.ggml.model";
  if (!f.has(key)) throw Error(fmt::format("{}: no tokenizer in file (missing '{}')", f.path(), key));
  const std::string model = f.get_string(key);
  const std::string pre = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : std::string();
  if (model == "llama") {
    tok::VocabDefaults d;
    d.bos = 1;
    d.eos = 2;
    d.unk = 0;
    d.add_bos = true;
    d.add_space_prefix = true;
    return tok::make_spm(tok::load_vocab(f, model, pre, d));
  }
  if (model == "gpt2") {
    tok::PreTokenizer p;
    try {
      p = tok::pre_tokenizer_for(pre);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: {}", f.path(), e.what()));
    }
    tok::VocabDefaults d;
    d.add_bos = p.add_bos;
    return tok::make_bpe(tok::load_vocab(f, model, pre, d), f, std::move(p));
  }
  throw Error(fmt::format("{}: unknown tokenizer model '{}' ({}); supported: llama, gpt2", f.path(), printable(model), key));
}

}  // namespace kvslim
