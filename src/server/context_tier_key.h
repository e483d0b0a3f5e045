#pragma once
// Key checks shared by the stored-context tiers (context_tier.h). A key or spec reaches file names and
// Redis key names as is, so only the characters the server's keys use are accepted: lower-case hex
// digits and '-'. No '/', '.' or NUL can get through, so a key never names a path outside the tier.
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim::server::tier_key {

/// Longest key or spec accepted (the server's are 16 + 1 + up to 10 + 1 + 16 characters).
inline constexpr size_t kMaxLength = 200;

inline bool valid(std::string_view s) {
  if (s.empty() || s.size() > kMaxLength) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-')) return false;
  return true;
}

/// Throws kvslim::Error naming the tier, what the text is ("key", "spec") and the text.
inline void check(std::string_view s, const char* tier, const char* what) {
  if (!valid(s))
    throw Error(fmt::format("context store {}: {} \"{}\" is not valid (only 0-9, a-f and '-', 1 to {} characters)",
                            tier, what, printable(s), kMaxLength));
}

/// The spec and token count of a key "<spec>-<n>-<hash>", or nullopt when it is not of that form.
struct Parts {
  std::string_view spec;
  int tokens;
};
inline std::optional<Parts> parse(std::string_view key) {
  const size_t h = key.rfind('-');
  if (h == std::string_view::npos || h == 0 || h + 1 == key.size()) return std::nullopt;
  const size_t n = key.rfind('-', h - 1);
  if (n == std::string_view::npos || n == 0 || n + 1 == h || h - n - 1 > 9) return std::nullopt;
  int tokens = 0;
  for (size_t i = n + 1; i < h; ++i) {
    if (key[i] < '0' || key[i] > '9') return std::nullopt;
    tokens = tokens * 10 + (key[i] - '0');
  }
  return Parts{key.substr(0, n), tokens};
}

/// The tokens of the build locks a tier took (thread-safe), so that unlock() releases only a lock
/// this process holds, and only while it still holds this token.
class LockTokens {
 public:
  void put(const std::string& key, std::string token) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_[key] = std::move(token);
  }
  /// The token of `key`, forgotten; nullopt when this tier took no lock on it.
  std::optional<std::string> take(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(key);
    if (it == tokens_.end()) return std::nullopt;
    std::string token = std::move(it->second);
    tokens_.erase(it);
    return token;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> tokens_;
};

}  // namespace kvslim::server::tier_key
