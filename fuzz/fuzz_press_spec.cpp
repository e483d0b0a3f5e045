// libFuzzer target: the press spec parser (make_press) on arbitrary text. Every input must end in
// a press or kvslim::Error; a press that parses must describe itself as a spec that parses back
// to the same description (the round trip the CLI, the server and eval records rely on).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvslim/error.h"
#include "kvslim/press.h"

using namespace kvslim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<Press> p;
  try {
    p = make_press(spec, 0.5);
  } catch (const Error&) {
    return 0;
  }
  const std::string d = p->describe();
  try {
    if (make_press(d, 0.5)->describe() != d) std::abort();  // describe() is not a fixed point
  } catch (const Error&) {
    std::abort();  // describe() wrote a spec make_press rejects
  }
  return 0;
}
