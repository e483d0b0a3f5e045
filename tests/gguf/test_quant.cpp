// Tests of src/gguf/quant.cpp: type facts, fp16/bf16 conversion, and (de)quantization against
// ggml's own output stored in tests/data/reference/quant-vectors.gguf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/quant.h"

using namespace kvslim;

namespace {

const std::string kVectors = std::string(KVSLIM_SOURCE_DIR) + "/tests/data/reference/quant-vectors.gguf";

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / a.size());
}

// Quantizes then dequantizes `x` (rows of n) with type t.
std::vector<float> round_trip(GGMLType t, const std::vector<float>& x, int64_t n) {
  const size_t rb = row_bytes(t, n);
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  std::vector<uint8_t> q(rb * rows);
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, x.data() + r * n, q.data() + r * rb, n);
    dequantize_row(t, q.data() + r * rb, y.data() + r * n, n);
  }
  return y;
}

}  // namespace

TEST(QuantTraits, SizesMatchGgml) {
  struct Want {
    GGMLType t;
    const char* name;
    int64_t block;
    size_t size;
    bool supported;
  };
  const Want want[] = {
      {GGMLType::F32, "f32", 1, 4, true},      {GGMLType::F16, "f16", 1, 2, true},
      {GGMLType::BF16, "bf16", 1, 2, true},    {GGMLType::Q4_0, "q4_0", 32, 18, true},
      {GGMLType::Q4_1, "q4_1", 32, 20, true},  {GGMLType::Q5_0, "q5_0", 32, 22, true},
      {GGMLType::Q5_1, "q5_1", 32, 24, true},  {GGMLType::Q8_0, "q8_0", 32, 34, true},
      {GGMLType::Q8_1, "q8_1", 32, 36, false}, {GGMLType::Q2_K, "q2_K", 256, 84, true},
      {GGMLType::Q3_K, "q3_K", 256, 110, true}, {GGMLType::Q4_K, "q4_K", 256, 144, true},
      {GGMLType::Q5_K, "q5_K", 256, 176, true}, {GGMLType::Q6_K, "q6_K", 256, 210, true},
      {GGMLType::Q8_K, "q8_K", 256, 292, true}, {GGMLType::I8, "i8", 1, 1, false},
      {GGMLType::I16, "i16", 1, 2, false},     {GGMLType::I32, "i32", 1, 4, false},
      {GGMLType::I64, "i64", 1, 8, false},     {GGMLType::F64, "f64", 1, 8, false},
  };
  for (const Want& w : want) {
    const TypeTraits* tr = type_traits(w.t);
    ASSERT_NE(tr, nullptr) << w.name;
    EXPECT_STREQ(tr->name, w.name);
    EXPECT_STREQ(type_name(w.t), w.name);
    EXPECT_EQ(tr->block_size, w.block) << w.name;
    EXPECT_EQ(tr->type_size, w.size) << w.name;
    EXPECT_EQ(tr->supported, w.supported) << w.name;
  }
}

TEST(QuantTraits, UnknownTypes) {
  EXPECT_EQ(type_traits(static_cast<GGMLType>(4)), nullptr);  // removed q4_2
  EXPECT_EQ(type_traits(static_cast<GGMLType>(999)), nullptr);
  EXPECT_STREQ(type_name(static_cast<GGMLType>(999)), "type#999");
  EXPECT_THROW(row_bytes(static_cast<GGMLType>(5), 32), Error);
}

TEST(QuantTraits, RowBytes) {
  EXPECT_EQ(row_bytes(GGMLType::F32, 7), 28u);
  EXPECT_EQ(row_bytes(GGMLType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(GGMLType::Q4_K, 512), 288u);
  EXPECT_EQ(row_bytes(GGMLType::Q6_K, 0), 0u);
}

TEST(QuantTraits, RowBytesRejectsPartialBlock) {
  try {
    row_bytes(GGMLType::Q4_K, 300);
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("q4_K"), std::string::npos) << msg;
    EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  }
  EXPECT_THROW(row_bytes(GGMLType::Q8_0, 33), Error);
  EXPECT_THROW(row_bytes(GGMLType::F16, -1), Error);
}

TEST(QuantTraits, UnsupportedTypesThrow) {
  std::vector<uint8_t> buf(64);
  std::vector<float> f(32);
  EXPECT_THROW(dequantize_row(GGMLType::Q8_1, buf.data(), f.data(), 32), Error);
  EXPECT_THROW(quantize_row(GGMLType::Q8_1, f.data(), buf.data(), 32), Error);
  EXPECT_THROW(quantize_row(GGMLType::I32, f.data(), buf.data(), 8), Error);
  EXPECT_THROW(dequantize_row(GGMLType::Q4_0, buf.data(), f.data(), 31), Error);
}

// Every finite half converts to float and back unchanged; NaNs stay NaN.
TEST(Fp16, RoundTripsAllHalves) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      const uint16_t back = fp32_to_fp16(f);
      EXPECT_EQ(back & 0x7C00, 0x7C00) << h;
      EXPECT_NE(back & 0x3FF, 0) << h;
    } else {
      ASSERT_EQ(fp32_to_fp16(f), h) << h;
    }
  }
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
}

// Exhaustive over adjacent positive halves: values just below/above the midpoint go down/up and
// the midpoint itself rounds to the even half (this covers subnormals and exponent carries).
TEST(Fp16, RoundsToNearestEven) {
  for (uint16_t h = 0; h < 0x7BFF; ++h) {
    const float lo = fp16_to_fp32(h), hi = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: halves have few mantissa bits
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 0.f)), h);
    ASSERT_EQ(fp32_to_fp16(std::nextafter(mid, 1e9f)), h + 1);
    ASSERT_EQ(fp32_to_fp16(mid), (h & 1) ? h + 1 : h);
    ASSERT_EQ(fp32_to_fp16(-mid), ((h & 1) ? h + 1 : h) | 0x8000);
  }
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // tie above the max rounds to Inf
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
}

TEST(Bf16, ConversionMatchesGgml) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(fp32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.f)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to Inf
  // A signalling NaN whose payload lives only in the low bits stays a (quiet) NaN.
  float snan;
  const uint32_t snan_bits = 0x7F800001;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_EQ(fp32_to_bf16(snan), 0x7FC0);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), h);
    }
  }
}

// ---- Against ggml's output ----

class QuantReference : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    file_ = GGUFFile::open(kVectors);
    const TensorInfo& src = file_->tensor("source");
    ASSERT_EQ(src.type, GGMLType::F32);
    ASSERT_EQ(src.ne.size(), 2u);
    n_ = src.ne[0];
    rows_ = src.ne[1];
    source_ = file_->tensor_f32(src);
  }
  std::unique_ptr<GGUFFile> file_;
  int64_t n_ = 0, rows_ = 0;
  std::vector<float> source_;
};

// T.dequant is ggml's dequantization of T.quant: ours must agree bit for bit.
TEST_P(QuantReference, DequantizeIsBitExact) {
  const std::string name = GetParam();
  const TensorInfo& q = file_->tensor(name + ".quant");
  const TensorInfo& dq = file_->tensor(name + ".dequant");
  ASSERT_STREQ(type_name(q.type), name.c_str());
  ASSERT_EQ(dq.type, GGMLType::F32);
  const size_t rb = row_bytes(q.type, n_);
  ASSERT_EQ(q.nbytes, rb * rows_);
  const auto* want = static_cast<const float*>(dq.data);
  std::vector<float> got(n_);
  for (int64_t r = 0; r < rows_; ++r) {
    dequantize_row(q.type, static_cast<const uint8_t*>(q.data) + r * rb, got.data(), n_);
    for (int64_t i = 0; i < n_; ++i) {
      float w;
      std::memcpy(&w, want + r * n_ + i, 4);
      ASSERT_EQ(bits(got[i]), bits(w)) << name << " row " << r << " element " << i;
    }
  }
}

// T.quant is ggml's reference quantization of source: ours must produce the same bytes.
TEST_P(QuantReference, QuantizeIsByteExact) {
  const std::string name = GetParam();
  const TensorInfo& q = file_->tensor(name + ".quant");
  const size_t rb = row_bytes(q.type, n_);
  const auto* want = static_cast<const uint8_t*>(q.data);
  std::vector<uint8_t> got(rb);
  for (int64_t r = 0; r < rows_; ++r) {
    quantize_row(q.type, source_.data() + r * n_, got.data(), n_);
    for (size_t i = 0; i < rb; ++i) {
      ASSERT_EQ(got[i], want[r * rb + i]) << name << " row " << r << " byte " << i << " (block "
                                          << i / type_traits(q.type)->type_size << ")";
    }
  }
}

// Round-trip error is no worse than ggml's own (implied by the exact tests, but reported on its
// own so a regression shows how far off it is).
TEST_P(QuantReference, RoundTripErrorMatchesGgml) {
  const std::string name = GetParam();
  const TensorInfo& q = file_->tensor(name + ".quant");
  const std::vector<float> ref = file_->tensor_f32(file_->tensor(name + ".dequant"));
  const double ours = rmse(source_, round_trip(q.type, source_, n_));
  const double theirs = rmse(source_, ref);
  EXPECT_LE(ours, theirs * 1.05 + 1e-12) << name;
}

INSTANTIATE_TEST_SUITE_P(Ggml, QuantReference,
                         ::testing::Values("f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                           "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// ---- Properties on other data ----

// Q8_K has no reference tensor: check layout invariants and the error bound of 8-bit steps.
TEST(QuantQ8K, LayoutAndError) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> x(512);
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> q(row_bytes(GGMLType::Q8_K, 512));
  quantize_row(GGMLType::Q8_K, x.data(), q.data(), 512);
  for (int b = 0; b < 2; ++b) {
    const uint8_t* blk = q.data() + b * 292;
    float d;
    std::memcpy(&d, blk, 4);
    float amax = 0;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[b * 256 + j]));
    EXPECT_NEAR(std::fabs(d), amax / 127, amax * 1e-6);  // sign follows the extreme value
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += static_cast<int8_t>(blk[4 + g * 16 + k]);
      int16_t bsum;
      std::memcpy(&bsum, blk + 260 + 2 * g, 2);
      EXPECT_EQ(bsum, sum);
    }
    std::vector<float> y(256);
    dequantize_row(GGMLType::Q8_K, blk, y.data(), 256);
    for (int j = 0; j < 256; ++j) EXPECT_LE(std::fabs(y[j] - x[b * 256 + j]), std::fabs(d) * 0.5f + 1e-6f);
  }
}

// All-zero input must give all-zero output (no NaN from 0/0 scale searches).
TEST(QuantRoundTrip, ZerosStayZero) {
  const GGMLType types[] = {GGMLType::F16, GGMLType::BF16, GGMLType::Q4_0, GGMLType::Q4_1,
                            GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0, GGMLType::Q8_K,
                            GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::Q4_K, GGMLType::Q5_K,
                            GGMLType::Q6_K};
  const std::vector<float> x(512, 0.f);
  for (GGMLType t : types) {
    const std::vector<float> y = round_trip(t, x, 512);
    for (float v : y) ASSERT_EQ(v, 0.f) << type_name(t);
  }
}

// On Gaussian data every format stays within a loose, bit-width-dependent relative error.
TEST(QuantRoundTrip, GaussianErrorBounds) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(256 * 16);
  for (float& v : x) v = nd(rng);
  const std::vector<float> zero(x.size(), 0.f);
  const double sd = rmse(x, zero);
  struct Bound {
    GGMLType t;
    double rel;
  };
  const Bound bounds[] = {
      {GGMLType::F32, 0.0},    {GGMLType::F16, 3e-4},   {GGMLType::BF16, 2.5e-3},
      {GGMLType::Q8_0, 0.01},  {GGMLType::Q8_K, 0.01},  {GGMLType::Q6_K, 0.03},
      {GGMLType::Q5_0, 0.07},  {GGMLType::Q5_1, 0.07},  {GGMLType::Q5_K, 0.05},
      {GGMLType::Q4_0, 0.13},  {GGMLType::Q4_1, 0.13},  {GGMLType::Q4_K, 0.1},
      {GGMLType::Q3_K, 0.22},  {GGMLType::Q2_K, 0.4},
  };
  for (const Bound& b : bounds) {
    const double e = rmse(x, round_trip(b.t, x, 1024)) / sd;
    EXPECT_LE(e, b.rel) << type_name(b.t);
  }
}
