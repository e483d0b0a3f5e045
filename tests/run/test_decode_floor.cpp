// The two sides of `kvslim bench --floor` (src/run/decode_floor.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/threads.h"
#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "run/decode_floor.h"

using namespace kvslim;

namespace {

std::unique_ptr<GGUFFile> file_with(bool output) {
  GGUFWriter w;
  w.set("general.name", GGUFValue::str("floor"));
  // 10 rows of 64 columns in q8_0: 2 blocks of 34 bytes per row (GGUF spec) = 68 bytes, 680 in all.
  w.add_tensor_f32("token_embd.weight", GGMLType::Q8_0, {64, 10}, std::vector<float>(640, 0.5f));
  w.add_tensor_f32("blk.0.attn_q.weight", GGMLType::F16, {64, 64}, std::vector<float>(4096, 0.25f));  // 8,192 bytes
  if (output) w.add_tensor_f32("output.weight", GGMLType::F32, {64, 10}, std::vector<float>(640, 1.0f));  // 2,560
  return GGUFFile::from_bytes(w.bytes(), "floor test");
}

}  // namespace

// One row of the embedding table per token when the file has its own output matrix; the whole
// table when the output product reads it (tied embeddings).
TEST(DecodeFloor, WeightBytesCountOneEmbeddingRowUnlessTied) {
  EXPECT_EQ(decode_weight_bytes(*file_with(true)), 68u + 8192u + 2560u);
  EXPECT_EQ(decode_weight_bytes(*file_with(false)), 680u + 8192u);
}

// The probe reads its buffer back as written (it checks the sums itself) and gives one positive
// rate per pass; no time is asserted.
TEST(DecodeFloor, ReadRateGivesOneRatePerPass) {
  ReadProbe probe(size_t{4} << 20);
  const std::vector<double> r = probe.passes(3);
  ASSERT_EQ(r.size(), 3u);
  for (double g : r) EXPECT_GT(g, 0.0);
  EXPECT_THROW(probe.passes(0), Error);
}

// The hand-off probe completes its ping-pong with two threads (a positive latency; 0 would mean
// the partner never answered within its second), gives 0 with one thread, and rejects a round-trip
// count below 1. No time is asserted.
TEST(DecodeFloor, ThreadHandoffRunsWithTwoThreads) {
  const int saved = num_threads();
  set_num_threads(2);
  EXPECT_GT(thread_handoff_ns(200), 0.0);
  set_num_threads(1);
  EXPECT_EQ(thread_handoff_ns(200), 0.0);
  set_num_threads(saved);
  EXPECT_THROW(thread_handoff_ns(0), Error);
}
