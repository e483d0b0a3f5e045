#pragma once
// kvpress's class and parameter names as aliases of kvslim's press specs (internal to src/press
// and the CLI). Every kvpress `compression_ratio` is our `ratio`.
#include <string>
#include <utility>
#include <vector>

namespace kvslim {

/// kvslim press name for a kvpress class name ("SnapKVPress" -> "snapkv"); "" when none.
std::string kvpress_class_to_press(const std::string& kvpress_class);
/// kvpress class name of a kvslim press ("snapkv" -> "SnapKVPress"); "" when kvpress has none.
std::string kvpress_class_of(const std::string& press);
/// Our parameter name for a kvpress parameter of press `press` ("window_size" -> "window"); the
/// key itself when it has no alias.
std::string kvpress_param_to_ours(const std::string& press, const std::string& key);
/// (kvpress name, our name) of every parameter alias of `press` (compression_ratio excluded).
std::vector<std::pair<std::string, std::string>> kvpress_params_of(const std::string& press);

}  // namespace kvslim
