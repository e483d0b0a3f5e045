// libFuzzer target: the task-text JSON reader (`eval niah|ruler --text-config FILE`) on arbitrary
// bytes. Every input must end in a TaskText or kvslim::Error (malformed JSON, a wrong type, an
// unknown field, a value out of range), never in a crash or another exception type.
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvslim/error.h"
#include "kvslim/eval_tasks.h"

using namespace kvslim;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)TaskText::from_json_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const Error&) {
  }
  return 0;
}
