// libFuzzer target: the stored-context reader (kvslim/context.h). An input that begins with the
// file magic is a whole file image; any other input is taken as a payload and given a valid
// header and checksum, so mutations reach the payload and cache readers instead of stopping at the
// checksum. Every input must end in a parsed context or a kvslim::Error. A context that parses and
// matches the bundled model then answers a two-token question, so a cache the reader accepted is
// also safe for attention and decode.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "context/file.h"
#include "kvslim/context.h"
#include "kvslim/error.h"

using namespace kvslim;

namespace {
const Model& model() {
  static const std::unique_ptr<Model> m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  return *m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string image;
  if (size >= 8 && std::memcmp(data, "KVSLMCTX", 8) == 0)
    image.assign(reinterpret_cast<const char*>(data), size);
  else
    image = context::file_image(std::string(reinterpret_cast<const char*>(data), size));
  const auto* p = reinterpret_cast<const uint8_t*>(image.data());
  try {
    context::inspect_image(p, image.size(), "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  try {
    const Context c = context::load_image(model(), p, image.size(), "fuzz input");
    RequestOptions o;
    o.n_predict = 2;
    o.sampling.temp = 0;
    o.session.n_ctx = 4096;
    auto req = c.request(model(), {1, 2}, o);
    req->run();
  } catch (const Error&) {
  }
  return 0;
}
