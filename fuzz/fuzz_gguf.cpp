// libFuzzer target: the GGUF reader on arbitrary bytes, then what a model load reads from the
// header before any tensor math (the tokenizer vocabulary, the chat template, f32 conversion of
// small tensors). Every input must end in success or kvslim::Error; anything else (a crash, a
// sanitizer report, another exception type, a hang) is a finding.
#include <cstddef>
#include <cstdint>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"
#include "tokenizer/chat_template.h"

using namespace kvslim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GGUFFile> f;
  try {
    f = GGUFFile::from_memory(data, size, "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }
  // Every typed getter on every key: type confusion must raise kvslim::Error, never crash.
  for (const auto& [key, v] : f->metadata()) {
    try { (void)f->get_string(key); } catch (const Error&) {}
    try { (void)f->get_int(key); } catch (const Error&) {}
    try { (void)f->get_float(key); } catch (const Error&) {}
    try { (void)f->get_bool(key, false); } catch (const Error&) {}
    try { (void)f->get_string_array(key); } catch (const Error&) {}
    try { (void)f->get_float_array(key); } catch (const Error&) {}
    try { (void)f->get_int_array(key); } catch (const Error&) {}
  }
  for (const TensorInfo& t : f->tensors())
    if (t.nelements() <= (1 << 16)) {
      try { (void)f->tensor_f32(t); } catch (const Error&) {}
    }
  try {
    auto tok = Tokenizer::from_gguf(*f);
    const std::vector<Token> ids = tok->encode("Hello world, <s> 12345 \xc3\xa9\xe2\x96\x81!", true, true);
    (void)tok->decode(ids);
  } catch (const Error&) {
  }
  try {
    (void)ChatTemplate::from_gguf(*f);
  } catch (const Error&) {
  }
  return 0;
}
