#include "cli/memory_estimate.h"
#include "tools/tools.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>


namespace kvslim::cli {

namespace {

// Measures a segment holding n entries of small random-looking values (quantized codecs store the
// same bytes whatever the values; KIVI groups and the residual window are counted as they fill).
size_t measured_segment_bytes(KVCodec k, KVCodec v, const KVQuantOptions& q, int head_dim, size_t n) {
  Segment s(head_dim, k, v, q);
  std::vector<float> kr(head_dim), vr(head_dim);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    for (int d = 0; d < head_dim; ++d) {
      x = x * 1664525u + 1013904223u;
      kr[d] = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
      vr[d] = -kr[d];
    }
    s.append(kr.data(), vr.data(), static_cast<int32_t>(i));
  }
  return s.bytes();
}

double gib(size_t b) { return double(b) / double(size_t{1} << 30); }

// A figure with the unit that keeps it readable: GiB from 0.1 GiB, else MiB, else KiB.
std::string human(size_t b) {
  if (b >= (size_t{1} << 30) / 10) return fmt::format("{:.2f} GiB", gib(b));
  if (b >= (size_t{1} << 20) / 10) return fmt::format("{:.2f} MiB", double(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", double(b) / 1024);
}

// "Name:   value kB" from /proc/self/status or /proc/meminfo, in bytes; 0 when absent.
size_t proc_kb(const char* file, const std::string& name) {
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(name + ":", 0) == 0) {
      std::istringstream in(line.substr(name.size() + 1));
      size_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  return 0;
}

// The first line of a file, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// What the cgroup (v2, or v1's memory controller) still lets this process allocate; 0 = no limit.
size_t cgroup_room() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string max, cur;
    if (line.rfind("0::", 0) == 0) {
      max = first_line("/sys/fs/cgroup" + path + "/memory.max");
      cur = first_line("/sys/fs/cgroup" + path + "/memory.current");
      if (max.empty()) max = first_line("/sys/fs/cgroup/memory.max"), cur = first_line("/sys/fs/cgroup/memory.current");
    } else if (controllers.find("memory") != std::string::npos) {
      max = first_line("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      cur = first_line("/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes");
      if (max.empty())
        max = first_line("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        cur = first_line("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    } else {
      continue;
    }
    if (max.empty() || max == "max") continue;
    const double m = std::strtod(max.c_str(), nullptr), c = std::strtod(cur.c_str(), nullptr);
    if (!(m > 0) || m > 1e18) continue;  // v1 writes a huge number for "no limit"
    return m > c ? static_cast<size_t>(m - c) : 1;
  }
  return 0;
}

}  // namespace

size_t segment_bytes(KVCodec k, KVCodec v, const KVQuantOptions& q, int head_dim, size_t n) {
  // Past the KIVI residual window and a few groups every entry costs the same: two measured points
  // give the slope.
  const size_t g = q.kivi_bits ? static_cast<size_t>(std::max(1, q.kivi_group)) : 16;
  const size_t n1 = (q.kivi_bits ? static_cast<size_t>(q.kivi_residual) : 0) + 8 * g, n2 = n1 + 32 * g;
  if (n <= n2) return measured_segment_bytes(k, v, q, head_dim, n);
  const size_t b1 = measured_segment_bytes(k, v, q, head_dim, n1), b2 = measured_segment_bytes(k, v, q, head_dim, n2);
  return b2 + static_cast<size_t>(std::llround(double(b2 - b1) / double(n2 - n1) * double(n - n2)));
}

size_t scratch_bytes(const HParams& hp, int n, bool all_logits) {
  const size_t rows = static_cast<size_t>(std::max(1, n)), hd = hp.head_dim;
  const size_t floats = rows * (3 * size_t(hp.n_embd) + 2 * hp.n_head * hd + 2 * hp.n_head_kv * hd + 2 * size_t(hp.n_ff) + hd) +
                        (all_logits ? rows : 1) * size_t(hp.n_vocab);
  return floats * sizeof(float);
}

size_t kv_entries(const Press* press, size_t context, size_t later, int chunk_size, size_t n_ctx) {
  size_t n = context + later;
  if (press && chunk_size > 0 && context > static_cast<size_t>(chunk_size)) {
    const size_t kept = std::min(context, press->kept_of(context));
    n = std::max(std::min(context, kept + static_cast<size_t>(chunk_size)), kept + later);
  }
  return n_ctx ? std::min(n, n_ctx) : n;
}

MemoryEstimate estimate_memory(const Model& model, KVCodec k, KVCodec v, const KVQuantOptions& q, size_t kv_tokens,
                               int batch, size_t sequences) {
  const HParams& hp = model.hparams();
  MemoryEstimate e;
  e.weights = model.weight_bytes();
  e.kv_tokens = kv_tokens;
  e.kv_sequences = std::max<size_t>(1, sequences);
  e.n_layer = hp.n_layer, e.n_head_kv = hp.n_head_kv;
  e.kv = kv_tokens ? segment_bytes(k, v, q, hp.head_dim, kv_tokens) * size_t(hp.n_layer) * size_t(hp.n_head_kv) *
                         e.kv_sequences
                   : 0;
  e.kv_codecs = q.kivi_bits || q.hadamard ? describe_cache_config(k, v, q)
                : k == v                  ? std::string(codec_name(k))
                                          : fmt::format("k={} v={}", codec_name(k), codec_name(v));
  e.scratch = scratch_bytes(hp, static_cast<int>(std::min<size_t>(std::max(1, batch), std::max<size_t>(1, kv_tokens))));
  return e;
}

size_t available_memory() {
  size_t avail = proc_kb("/proc/meminfo", "MemAvailable");
  auto lower = [&avail](size_t room) {
    if (room) avail = avail ? std::min(avail, room) : room;
  };
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const size_t used = proc_kb("/proc/self/status", "VmSize");
    lower(lim.rlim_cur > used ? lim.rlim_cur - used : 1);
  }
  if (getrlimit(RLIMIT_DATA, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const size_t used = proc_kb("/proc/self/status", "VmData");
    lower(lim.rlim_cur > used ? lim.rlim_cur - used : 1);
  }
  lower(cgroup_room());
  return avail;
}

std::string describe(const MemoryEstimate& e, size_t available) {
  const std::string seqs = e.kv_sequences > 1 ? fmt::format(" x {} sequences", e.kv_sequences) : "";
  return fmt::format("memory: weights {} + KV cache {} ({}, {} tokens{}, {} layers x {} KV heads) + scratch {} = {}; "
                     "available {}",
                     human(e.weights), human(e.kv), e.kv_codecs, e.kv_tokens, seqs, e.n_layer, e.n_head_kv,
                     human(e.scratch), human(e.total()),
                     available ? fmt::format("{:.1f} GiB", gib(available)) : std::string("unknown"));
}

void report_memory(const MemoryEstimate& e, size_t available, bool check) { report_memory(e, e, available, check); }

void report_memory(const MemoryEstimate& shown, const MemoryEstimate& e, size_t available, bool check) {
  fmt::print(stderr, "{}\n", describe(shown, available));
  std::fflush(stderr);
  if (check && available && e.total() > available)
    throw Error(fmt::format(
        "the run needs about {} ({} of it KV cache for {} tokens{}) but {} is available: lower the context "
        "(-c), quantize the cache (--cache-type-k q8_0 --cache-type-v q8_0), or bound it with a press "
        "(--press NAME:budget=N --chunk-size M); --no-memory-check runs anyway",
        human(e.total()), human(e.kv), e.kv_tokens, e.kv_sequences > 1 ? fmt::format(" x {} sequences", e.kv_sequences) : "",
        human(available)));
}

CLI::Option* add_memory_check_flag(CLI::App* sub, bool& no_memory_check) {
  return sub->add_flag("--no-memory-check", no_memory_check,
                       "run even when the memory estimate (printed before the prefill) exceeds the memory available");
}

}  // namespace kvslim::cli
