// Repacking of weight rows into 16- or 8-row interleaved blocks (layout in kernels/packed_weights.h).
#include "kernels/packed_weights.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kvslim/error.h"

namespace kvslim::qdot {

namespace {


// Six-bit scale and min j (0..7) of a q4_K super-block's 12 scale bytes (ggml's packing: j < 4
// in the low six bits of bytes j and j+4; j >= 4 from the nibbles of byte j+4 and the top bits
// of bytes j-4 and j).
void k4_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// One n-row q4_K super-block (n = 8 or 16): rows[r] points at the rows' 144-byte blocks (null past
// the end).
void pack_q4k(const uint8_t* const rows[], int n, uint8_t* out) {
  std::memset(out, 0, kQ4KRowBytes * n);
  for (int r = 0; r < n; ++r) {
    const uint8_t* p = rows[r];
    if (!p) continue;
    std::memcpy(out + 2 * r, p, 2);              // d
    std::memcpy(out + 2 * n + 2 * r, p + 2, 2);  // dmin
    for (int g = 0; g < 8; ++g) k4_scale_min(g, p + 4, out[4 * n + n * g + r], out[12 * n + n * g + r]);
    const uint8_t* qs = p + 16;
    for (int v = 0; v < 32; ++v) std::memcpy(out + 20 * n + 4 * n * v + 4 * r, qs + 4 * v, 4);
  }
}

// Unsigned 6-bit value (the code plus 32) of column c (0..255) of a q6_K super-block p (210 bytes:
// ql[128], qh[64], scales[16], d), in ggml's bit planes (packed_weights.h).
int q6k_code(const uint8_t* p, int c) {
  const int h = c / 128, l = c % 128, quarter = l / 32, i = l % 32;
  const uint8_t ql = p[64 * h + 32 * (quarter & 1) + i];
  const int low = quarter < 2 ? ql & 0xF : ql >> 4;
  return low | (((p[128 + 32 * h + i] >> (2 * quarter)) & 3) << 4);
}

// One n-row q6_K super-block (n = 8 or 16): rows[r] points at the rows' 210-byte blocks (null past
// the end).
void pack_q6k(const uint8_t* const rows[], int n, uint8_t* out) {
  std::memset(out, 0, kQ6KRowBytes * n);
  for (int r = 0; r < n; ++r) {
    const uint8_t* p = rows[r];
    if (!p) continue;
    std::memcpy(out + 2 * r, p + 208, 2);  // d
    for (int g = 0; g < 16; ++g) out[2 * n + n * g + r] = p[192 + g];
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 4; ++i) {
          const int c = 128 * h + 4 * j + i, u3 = q6k_code(p, c + 96);
          uint8_t* v = out + q6k_unit(n, h, j) + 4 * r + i;
          for (int k = 0; k < 3; ++k) v[4 * n * k] = static_cast<uint8_t>(q6k_code(p, c + 32 * k) | ((u3 >> (2 * k)) & 3) << 6);
        }
  }
}

// One n-row q8_0 super-block of 8 blocks of 32 (n = 8 or 16): rows[r] points at the rows' 8 34-byte
// blocks (null past the end).
void pack_q8(const uint8_t* const rows[], int n, uint8_t* out) {
  std::memset(out, 0, kQ8RowBytes * n);
  for (int r = 0; r < n; ++r) {
    if (!rows[r]) continue;
    for (int g = 0; g < 8; ++g) {
      const uint8_t* p = rows[r] + 34 * g;
      std::memcpy(out + 2 * n * g + 2 * r, p, 2);  // d
      for (int q = 0; q < 8; ++q) std::memcpy(out + 16 * n + 4 * n * (8 * g + q) + 4 * r, p + 2 + 4 * q, 4);
    }
  }
}

void free_bytes(void* p) { std::free(p); }

// Bytes of a packed super-block of type t with n rows.
size_t block_bytes_for(GGMLType t, int n) {
  return t == GGMLType::Q4_K ? kQ4KRowBytes * n : t == GGMLType::Q6_K ? kQ6KRowBytes * n : t == GGMLType::Q8_0 ? kQ8RowBytes * n : 0;
}

}  // namespace

size_t packed_block_bytes(GGMLType t) { return block_bytes_for(t, packed_block_rows(t)); }

int packed_block_rows(GGMLType) {
  return level() == Level::AVX512 ? 16 : 8;
}

bool packable(const WeightView& W) {
  return packed_block_bytes(W.type) > 0 && W.cols > 0 && W.cols % 256 == 0 && W.rows > 0 && W.data;
}

namespace {

// Row blocks [b0, b1) of W packed back to back at out (P: W's block shape).
void pack_blocks(const WeightView& W, const PackedRows& P, int64_t b0, int64_t b1, uint8_t* out) {
  const int64_t nsb = W.cols / 256;
  const size_t in_block = row_bytes(W.type, 256);
  parallel_for(b1 - b0, [&](int64_t c0, int64_t c1) {
    for (int64_t b = b0 + c0; b < b0 + c1; ++b)
      for (int64_t s = 0; s < nsb; ++s) {
        const uint8_t* rows[16];
        const int64_t n = P.block_rows;
        for (int r = 0; r < n; ++r) rows[r] = n * b + r < W.rows ? W.row(n * b + r) + s * in_block : nullptr;
        uint8_t* dst = out + ((b - b0) * nsb + s) * static_cast<int64_t>(P.block_bytes);
        if (W.type == GGMLType::Q4_K) pack_q4k(rows, P.block_rows, dst);
        else if (W.type == GGMLType::Q6_K) pack_q6k(rows, P.block_rows, dst);
        else pack_q8(rows, P.block_rows, dst);
      }
  });
}

// W's block shape at this level, without bytes.
std::shared_ptr<PackedRows> shape_of(const WeightView& W) {
  if (!packable(W))
    throw Error(fmt::format("pack_rows: a {} x {} {} matrix cannot be packed (q4_K, q6_K or q8_0 with columns a multiple of 256)",
                            W.rows, W.cols, type_name(W.type)));
  auto P = std::make_shared<PackedRows>();
  P->type = W.type;
  P->rows = W.rows;
  P->cols = W.cols;
  P->block_rows = packed_block_rows(W.type);
  P->row_blocks = (W.rows + P->block_rows - 1) / P->block_rows;
  P->block_bytes = block_bytes_for(W.type, P->block_rows);  // the level is read once, above
  return P;
}

// Row blocks [b0, b1) holding rows [r0, r1) (none when the range is empty).
std::pair<int64_t, int64_t> blocks_of(const PackedRows& P, int64_t r0, int64_t r1) {
  if (r0 >= r1) return {0, 0};
  return {r0 / P.block_rows, (r1 + P.block_rows - 1) / P.block_rows};
}

// Parts start on 4 KiB boundaries, as matrices packed one by one do: the prefill of 512 tokens
// (Zen 5, Q4_K_M, 2 threads) ran 279 t/s with parts back to back and 286 so (medians of 6
// alternating rounds), at most 4 KiB more per part.
constexpr size_t kPartAlign = 4096;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Bytes of row blocks [b0, b1) of P's shape.
size_t blocks_bytes(const PackedRows& P, int64_t b0, int64_t b1) {
  return static_cast<size_t>(b1 - b0) * static_cast<size_t>(P.cols / 256) * P.block_bytes;
}

// `total` bytes, 64-byte aligned; runs of 2 MiB and more start on a 2 MiB boundary and their whole
// 2 MiB spans are offered to the kernel as transparent huge pages (the tail stays on small pages, so
// no memory is added): decode streams every byte once per token, and with 4 KiB pages each page is
// a TLB miss and a stop for the hardware prefetchers.
std::unique_ptr<uint8_t[], void (*)(void*)> alloc_packed(size_t total) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = total >= kHuge ? kHuge : 64;
  // posix_memalign: aligned_alloc wants the size a multiple of the alignment (sanitizers enforce it).
  void* mem = nullptr;
  if (posix_memalign(&mem, align, std::max<size_t>(64, (total + 63) / 64 * 64)) != 0) mem = nullptr;
  if (!mem) throw Error(fmt::format("pack_rows: cannot allocate {} bytes", total));
  if (align == kHuge && huge_pages_enabled()) madvise(mem, total / kHuge * kHuge, MADV_HUGEPAGE);
  return std::unique_ptr<uint8_t[], void (*)(void*)>(static_cast<uint8_t*>(mem), free_bytes);
}

}  // namespace

PackedRows PackedRows::view(const Part& p) const {
  PackedRows v;
  v.type = type;
  v.rows = p.row1 - p.row0;
  v.cols = cols;
  v.block_rows = block_rows;
  v.row_blocks = (v.rows + block_rows - 1) / block_rows;
  v.block_bytes = block_bytes;
  v.bytes = std::unique_ptr<uint8_t[], void (*)(void*)>(const_cast<uint8_t*>(p.at), [](void*) {});
  return v;
}

std::shared_ptr<const PackedRows> pack_rows(const WeightView& W) {
  std::shared_ptr<PackedRows> P = shape_of(W);
  P->bytes = alloc_packed(blocks_bytes(*P, 0, P->row_blocks));
  pack_blocks(W, *P, 0, P->row_blocks, P->bytes.get());
  return P;
}

std::pair<int64_t, int64_t> thread_rows(int64_t rows, int i, int n) {
  const int64_t units = (rows + 15) / 16;
  return {std::min(rows, 16 * (units * i / n)), std::min(rows, 16 * (units * (i + 1) / n))};
}

void pack_thread_major(const std::vector<WeightView*>& ws, int n) {
  if (n < 1) throw Error(fmt::format("pack_thread_major: {} threads", n));
  // First the parts' rows and bytes (an arena's size is its parts' sum), then the bytes.
  std::vector<std::shared_ptr<PackedRows>> shapes;
  std::vector<size_t> part_bytes, size(static_cast<size_t>(n), 0);
  for (const WeightView* W : ws) {
    shapes.push_back(shape_of(*W));
    for (int i = 0; i < n; ++i) {
      const auto [r0, r1] = thread_rows(W->rows, i, n);
      const auto [b0, b1] = blocks_of(*shapes.back(), r0, r1);
      shapes.back()->parts.push_back({r0, r1, nullptr});
      part_bytes.push_back(blocks_bytes(*shapes.back(), b0, b1));
      size[i] += round_up(part_bytes.back(), kPartAlign);
    }
  }
  auto arenas = std::make_shared<std::vector<std::unique_ptr<uint8_t[], void (*)(void*)>>>();
  std::vector<uint8_t*> cursor;
  for (int i = 0; i < n; ++i) {
    arenas->push_back(alloc_packed(size[i]));
    cursor.push_back(arenas->back().get());
  }
  for (size_t w = 0; w < ws.size(); ++w) {
    PackedRows& P = *shapes[w];
    P.arena = arenas;
    for (int i = 0; i < n; ++i) {
      PackedRows::Part& part = P.parts[static_cast<size_t>(i)];
      part.at = cursor[i];
      const auto [b0, b1] = blocks_of(P, part.row0, part.row1);
      pack_blocks(*ws[w], P, b0, b1, cursor[i]);
      cursor[i] += round_up(part_bytes[w * static_cast<size_t>(n) + static_cast<size_t>(i)], kPartAlign);
    }
    ws[w]->packed = shapes[w];
  }
}

bool thread_major_enabled() {
  const char* env = std::getenv("KVSLIM_THREAD_MAJOR");
  return !(env && std::string(env) == "0");
}

bool huge_pages_enabled() {
  const char* env = std::getenv("KVSLIM_HUGEPAGES");
  return !(env && std::string(env) == "0");
}

bool packing_enabled() {
  const char* env = std::getenv("KVSLIM_PACK");
  if (env && std::string(env) == "0") return false;
  return static_cast<int>(level()) >= static_cast<int>(Level::AVX2);
}

}  // namespace kvslim::qdot
