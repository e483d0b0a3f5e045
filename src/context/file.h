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

/// A context of everything `req` has run so far: its prompt and the generated tokens it advanced
/// over (position() tokens), its cache and its last logits. `press` and `press_report` are what the
/// context was compressed with; `chunk_size` as in ContextOptions. With `take_cache` the request's
/// cache is moved out (the request must not run again), else copied. Throws kvslim::Error when the
/// request has not prefilled its prompt or its logits are gone (after a rewind).
Context from_request(const Model& model, Request& req, const std::string& press, const std::string& press_report,
                     int chunk_size, bool take_cache);

}  // namespace kvslim::context
