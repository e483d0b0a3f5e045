#pragma once
// File helpers shared by the test files: temporary paths unique to the process (ctest runs tests
// in parallel processes) and whole-file reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

/// A path in the test temporary directory: TempDir()/kvslim_<pid>_<name>.
inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "kvslim_" + std::to_string(::getpid()) + "_" + name;
}

/// The whole file as bytes; "" when it cannot be read.
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
