#pragma once
// The context file's envelope (internal; kvslim/context.h is the public side), exposed for the
// fuzz target and the tests that corrupt files on purpose.
//
// Layout (little-endian):
//   magic "KVSLMCTX" | u32 format version | u32 0 | u64 payload bytes | u64 XXH64(payload) | payload
// The payload: the model fingerprint, the press as run and its statistics, the token ids and text,
// the last context token's logits, then the cache (kv::CacheIO).
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvslim/context.h"

namespace kvslim::context {

constexpr size_t kHeaderBytes = 32;

/// The file image of `payload` with a correct header for `version`.
std::string file_image(const std::string& payload, uint32_t version = kContextFormatVersion);

/// Checks a file image and parses everything in it (the cache included) without a model; what
/// Context::inspect does after reading the file. `label` names the input in errors. Throws
/// kvslim::Error for anything wrong.
ContextInfo inspect_image(const uint8_t* data, size_t size, const std::string& label);

/// Context::load from a file image already in memory (the fuzz target's way in).
Context load_image(const Model& model, const uint8_t* data, size_t size, const std::string& label);

}  // namespace kvslim::context
