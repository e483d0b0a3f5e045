#pragma once
// The kvslim version, set by CMake from project(VERSION ...); written into every eval record so a
// result names the code that produced it.
namespace kvslim {

#ifndef KVSLIM_VERSION
#define KVSLIM_VERSION "unknown"
#endif

/// The version string, e.g. "0.1.0".
inline constexpr const char* kVersion = KVSLIM_VERSION;

}  // namespace kvslim
