#include "kernels/weight_prefetch.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kvslim/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kvslim::qdot {

namespace {

/// The CPU's family as CPUID leaf 1 gives it (base family, plus the extended family when the base
/// is 0xF), and whether the vendor is AMD; family 0 where CPUID is missing.
struct CpuFamily {
  bool amd = false;
  unsigned family = 0;
};

CpuFamily cpu_family() {
  CpuFamily f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.amd = std::strcmp(vendor, "AuthenticAMD") == 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned base = (a >> 8) & 0xF, ext = (a >> 20) & 0xFF;
  f.family = base == 0xF ? base + ext : base;
#endif
  return f;
}

Prefetch initial_prefetch() {
  const Prefetch def = default_prefetch();
  if (const char* env = std::getenv("KVSLIM_PREFETCH")) {
    try {
      return parse_prefetch(env);
    } catch (const Error& e) {
      std::fprintf(stderr, "kvslim: KVSLIM_PREFETCH=%s: %s; using %s\n", env, e.what(), prefetch_name(def));
    }
  }
  return def;
}

std::atomic<int>& current() {
  static std::atomic<int> p{static_cast<int>(initial_prefetch())};
  return p;
}

}  // namespace

Prefetch default_prefetch() {
  static const Prefetch p = [] {
    const CpuFamily f = cpu_family();
    return f.amd && f.family == 0x19 ? Prefetch::None : Prefetch::Ahead;
  }();
  return p;
}

Prefetch prefetch() { return static_cast<Prefetch>(current().load(std::memory_order_relaxed)); }

void set_prefetch(Prefetch p) { current().store(static_cast<int>(p)); }

const char* prefetch_name(Prefetch p) { return p == Prefetch::None ? "none" : "ahead"; }

Prefetch parse_prefetch(const std::string& name) {
  if (name == "none") return Prefetch::None;
  if (name == "ahead") return Prefetch::Ahead;
  throw Error(fmt::format("unknown weight prefetch setting '{}' (expected none or ahead)", name));
}

}  // namespace kvslim::qdot
