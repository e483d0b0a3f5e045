// Tests of src/gguf/reader.cpp and writer.cpp: the byte layout against the GGUF specification
// (hand-built images), a writer -> reader round trip of every value type, alignment, v2 files,
// and hostile input: every malformed field raises kvslim::Error naming the file and the field,
// and no truncation or byte flip of a real model file can crash the reader.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/quant.h"
#include "support/files.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_str(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}
template <class T>
void poke(std::string& bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(&bytes[at], &v, sizeof(T));
}
template <class T>
T peek(const std::string& bytes, size_t at) {
  T v;
  std::memcpy(&v, &bytes[at], sizeof(T));
  return v;
}

/// Offset of the first occurrence of a GGUF string (length prefix + text): the offset of its
/// 8-byte length field.
size_t find_gguf_string(const std::string& bytes, const std::string& s) {
  std::string pat;
  put_str(pat, s);
  size_t at = bytes.find(pat);
  EXPECT_NE(at, std::string::npos) << "string '" << s << "' not found";
  return at;
}

/// Offset of the type field of tensor `name` in the tensor-info section.
size_t tensor_type_offset(const std::string& bytes, const std::string& name) {
  size_t at = find_gguf_string(bytes, name) + 8 + name.size();
  uint32_t nd = peek<uint32_t>(bytes, at);
  return at + 4 + 8 * nd;
}

/// Expects `fn` to raise kvslim::Error whose message holds every one of `parts`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no kvslim::Error raised";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
        << "message '" << e.what() << "' lacks '" << p << "'";
  }
}

std::unique_ptr<GGUFFile> parse(const std::string& bytes, const std::string& label = "mem.gguf") {
  return GGUFFile::from_memory(bytes.data(), bytes.size(), label);
}

GGUFValue array_of(GGUFValueType et) {
  GGUFValue v;
  v.type = GGUFValueType::ARRAY;
  v.elem_type = et;
  return v;
}
GGUFValue scalar(GGUFValueType t) {
  GGUFValue v;
  v.type = t;
  return v;
}

/// A small valid file: one key and one f32 tensor [4], as bytes.
std::string tiny_file() {
  GGUFWriter w;
  w.set("general.name", GGUFValue::str("tiny"));
  w.add_tensor_f32("t", GGMLType::F32, {4}, {1, 2, 3, 4});
  return w.bytes();
}

}  // namespace

// ---- layout against the specification -----------------------------------------------------

TEST(GGUFWriter, BytesFollowTheSpecification) {
  GGUFWriter w;
  w.set("a", GGUFValue::u32(7));
  w.add_tensor("w", GGMLType::F32, {2}, std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8));  // 1.0f, 2.0f
  // Hand-built from the spec: magic, version, tensor_count, kv_count, kv (key, type, value),
  // tensor info (name, n_dims, ne, type, offset), padding to 32, data, padding to 32.
  std::string want;
  put<uint32_t>(want, 0x46554747u);
  put<uint32_t>(want, 3);
  put<uint64_t>(want, 1);
  put<uint64_t>(want, 1);
  put_str(want, "a");
  put<uint32_t>(want, 4);  // UINT32
  put<uint32_t>(want, 7);
  put_str(want, "w");
  put<uint32_t>(want, 1);
  put<int64_t>(want, 2);
  put<uint32_t>(want, 0);  // F32
  put<uint64_t>(want, 0);
  ASSERT_EQ(want.size(), 74u);
  want.resize(96, '\0');  // the data section starts at the next multiple of 32
  want += std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  want.resize(128, '\0');  // and the file ends on one
  std::string got = w.bytes();
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
}

// ---- round trip of every value type ---------------------------------------------------------

TEST(GGUFRoundTrip, EveryValueType) {
  GGUFWriter w;
  GGUFValue v;
  v = scalar(GGUFValueType::UINT8), v.u = 255, w.set("u8", v);
  v = scalar(GGUFValueType::INT8), v.i = -128, w.set("i8", v);
  v = scalar(GGUFValueType::UINT16), v.u = 65535, w.set("u16", v);
  v = scalar(GGUFValueType::INT16), v.i = -32768, w.set("i16", v);
  w.set("u32", GGUFValue::u32(0xFFFFFFFFu));
  w.set("i32", GGUFValue::i32(std::numeric_limits<int32_t>::min()));
  w.set("f32", GGUFValue::f32(-1.5e-7f));
  w.set("bool_t", GGUFValue::boolean(true));
  w.set("bool_f", GGUFValue::boolean(false));
  w.set("str", GGUFValue::str(std::string("h\xc3\xa9llo\0w\xf0\x9f\x98\x80", 12)));  // UTF-8 and a NUL
  w.set("str_empty", GGUFValue::str(""));
  w.set("u64", GGUFValue::u64(std::numeric_limits<uint64_t>::max()));
  v = scalar(GGUFValueType::INT64), v.i = std::numeric_limits<int64_t>::min(), w.set("i64", v);
  v = scalar(GGUFValueType::FLOAT64), v.f = 0.1, w.set("f64", v);  // not representable in f32

  v = array_of(GGUFValueType::UINT8), v.uints = {0, 1, 255}, w.set("a_u8", v);
  v = array_of(GGUFValueType::INT8), v.ints = {-128, 0, 127}, w.set("a_i8", v);
  v = array_of(GGUFValueType::UINT16), v.uints = {65535, 2}, w.set("a_u16", v);
  v = array_of(GGUFValueType::INT16), v.ints = {-32768, 32767}, w.set("a_i16", v);
  v = array_of(GGUFValueType::UINT32), v.uints = {0xFFFFFFFFu, 3}, w.set("a_u32", v);
  w.set("a_i32", GGUFValue::i32_array({std::numeric_limits<int32_t>::min(), -1, 5}));
  w.set("a_f32", GGUFValue::f32_array({0.5f, -2.25f, 1e30f}));
  v = array_of(GGUFValueType::BOOL), v.ints = {1, 0, 1, 1}, w.set("a_bool", v);
  w.set("a_str", GGUFValue::str_array({"a", "", "three"}));
  v = array_of(GGUFValueType::UINT64), v.uints = {std::numeric_limits<uint64_t>::max(), 0}, w.set("a_u64", v);
  v = array_of(GGUFValueType::INT64), v.ints = {std::numeric_limits<int64_t>::min(), 42}, w.set("a_i64", v);
  v = array_of(GGUFValueType::FLOAT64), v.floats = {0.1, -1e300}, w.set("a_f64", v);
  w.set("a_empty_u8", array_of(GGUFValueType::UINT8));
  w.set("a_empty_str", array_of(GGUFValueType::STRING));
  w.set("a_empty_arr", array_of(GGUFValueType::ARRAY));
  {  // [[1, 2], [], [3]] of int32, and [["x"], ["y", "z"]] of strings, and a 3-deep nest
    GGUFValue outer = array_of(GGUFValueType::ARRAY);
    outer.arrays = {GGUFValue::i32_array({1, 2}), GGUFValue::i32_array({}), GGUFValue::i32_array({3})};
    w.set("a_nested_i32", outer);
    GGUFValue strs = array_of(GGUFValueType::ARRAY);
    strs.arrays = {GGUFValue::str_array({"x"}), GGUFValue::str_array({"y", "z"})};
    w.set("a_nested_str", strs);
    GGUFValue deep = array_of(GGUFValueType::ARRAY);
    GGUFValue mid = array_of(GGUFValueType::ARRAY);
    mid.arrays = {GGUFValue::f32_array({7.0f})};
    deep.arrays = {mid};
    w.set("a_nested_deep", deep);
  }

  std::string bytes = w.bytes();
  auto f = parse(bytes);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().size(), 32u);  // 14 scalars, 12 arrays, 3 empty, 3 nested
  EXPECT_EQ(f->metadata()[0].first, "u8");  // insertion order kept
  auto get = [&](const std::string& k) -> const GGUFValue& {
    const GGUFValue* p = f->find(k);
    EXPECT_NE(p, nullptr) << k;
    static GGUFValue none;
    return p ? *p : none;
  };
  EXPECT_EQ(get("u8").type, GGUFValueType::UINT8);
  EXPECT_EQ(get("u8").u, 255u);
  EXPECT_EQ(get("i8").type, GGUFValueType::INT8);
  EXPECT_EQ(get("i8").i, -128);
  EXPECT_EQ(get("u16").u, 65535u);
  EXPECT_EQ(get("i16").i, -32768);
  EXPECT_EQ(get("u32").type, GGUFValueType::UINT32);
  EXPECT_EQ(get("u32").u, 0xFFFFFFFFu);
  EXPECT_EQ(get("i32").i, std::numeric_limits<int32_t>::min());
  EXPECT_EQ(get("f32").type, GGUFValueType::FLOAT32);
  EXPECT_EQ(static_cast<float>(get("f32").f), -1.5e-7f);
  EXPECT_EQ(get("bool_t").type, GGUFValueType::BOOL);
  EXPECT_TRUE(get("bool_t").b);
  EXPECT_FALSE(get("bool_f").b);
  EXPECT_EQ(get("str").s, std::string("h\xc3\xa9llo\0w\xf0\x9f\x98\x80", 12));
  EXPECT_EQ(get("str_empty").type, GGUFValueType::STRING);
  EXPECT_EQ(get("str_empty").s, "");
  EXPECT_EQ(get("u64").type, GGUFValueType::UINT64);
  EXPECT_EQ(get("u64").u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(get("i64").type, GGUFValueType::INT64);
  EXPECT_EQ(get("i64").i, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(get("f64").type, GGUFValueType::FLOAT64);
  EXPECT_EQ(get("f64").f, 0.1);

  EXPECT_EQ(get("a_u8").elem_type, GGUFValueType::UINT8);
  EXPECT_EQ(get("a_u8").uints, (std::vector<uint64_t>{0, 1, 255}));
  EXPECT_EQ(get("a_i8").ints, (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(get("a_u16").uints, (std::vector<uint64_t>{65535, 2}));
  EXPECT_EQ(get("a_i16").ints, (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(get("a_u32").uints, (std::vector<uint64_t>{0xFFFFFFFFu, 3}));
  EXPECT_EQ(f->get_int_array("a_i32"), (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -1, 5}));
  EXPECT_EQ(f->get_float_array("a_f32"), (std::vector<float>{0.5f, -2.25f, 1e30f}));
  EXPECT_EQ(get("a_bool").elem_type, GGUFValueType::BOOL);
  EXPECT_EQ(get("a_bool").ints, (std::vector<int64_t>{1, 0, 1, 1}));
  EXPECT_EQ(f->get_string_array("a_str"), (std::vector<std::string>{"a", "", "three"}));
  EXPECT_EQ(get("a_u64").uints, (std::vector<uint64_t>{std::numeric_limits<uint64_t>::max(), 0}));
  EXPECT_EQ(get("a_i64").ints, (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 42}));
  EXPECT_EQ(get("a_f64").floats, (std::vector<double>{0.1, -1e300}));
  EXPECT_EQ(get("a_empty_u8").type, GGUFValueType::ARRAY);
  EXPECT_EQ(get("a_empty_u8").elem_type, GGUFValueType::UINT8);
  EXPECT_EQ(get("a_empty_u8").size(), 0u);
  EXPECT_EQ(get("a_empty_str").elem_type, GGUFValueType::STRING);
  EXPECT_EQ(get("a_empty_str").size(), 0u);
  EXPECT_EQ(get("a_empty_arr").elem_type, GGUFValueType::ARRAY);
  EXPECT_EQ(get("a_empty_arr").size(), 0u);

  const GGUFValue& n = get("a_nested_i32");
  EXPECT_EQ(n.elem_type, GGUFValueType::ARRAY);
  ASSERT_EQ(n.arrays.size(), 3u);
  EXPECT_EQ(n.arrays[0].elem_type, GGUFValueType::INT32);
  EXPECT_EQ(n.arrays[0].ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(n.arrays[1].size(), 0u);
  EXPECT_EQ(n.arrays[2].ints, (std::vector<int64_t>{3}));
  const GGUFValue& ns = get("a_nested_str");
  ASSERT_EQ(ns.arrays.size(), 2u);
  EXPECT_EQ(ns.arrays[1].strings, (std::vector<std::string>{"y", "z"}));
  const GGUFValue& d = get("a_nested_deep");
  ASSERT_EQ(d.arrays.size(), 1u);
  ASSERT_EQ(d.arrays[0].arrays.size(), 1u);
  EXPECT_EQ(d.arrays[0].arrays[0].floats, (std::vector<double>{7.0}));

  // Writing what was read gives the same bytes: nothing is lost or re-typed on the way.
  GGUFWriter again;
  for (auto& [k, val] : f->metadata()) again.set(k, val);
  EXPECT_TRUE(again.bytes() == bytes);
}

TEST(GGUFRoundTrip, TypedGetters) {
  GGUFWriter w;
  GGUFValue v = scalar(GGUFValueType::UINT64);
  v.u = uint64_t(1) << 63;
  w.set("huge", v);
  w.set("small", GGUFValue::u32(12));
  w.set("name", GGUFValue::str("x"));
  std::string bytes = w.bytes();
  auto f = parse(bytes, "getters.gguf");
  EXPECT_EQ(f->get_int("small"), 12);
  EXPECT_EQ(f->get_float("small"), 12.0);
  EXPECT_EQ(f->get_int("absent", -3), -3);
  expect_error([&] { f->get_int("huge"); }, {"getters.gguf", "'huge'", "out of range"});
  expect_error([&] { f->get_int("name"); }, {"getters.gguf", "'name'", "integer"});
  expect_error([&] { f->get_string("small"); }, {"getters.gguf", "'small'", "string"});
  expect_error([&] { f->get_string("absent"); }, {"getters.gguf", "missing", "'absent'"});
  expect_error([&] { f->tensor("nope"); }, {"getters.gguf", "missing tensor 'nope'"});
}

// ---- tensors and alignment ----------------------------------------------------------------

TEST(GGUFTensors, OffsetsAndDataRespectCustomAlignment) {
  for (uint32_t align : {32u, 64u, 1u, 256u}) {
    GGUFWriter w;
    if (align != 32) w.set("general.alignment", GGUFValue::u32(align));
    std::vector<float> a = {1, 2, 3}, b(64), c = {-1, -2, -3, -4, -5};
    for (int i = 0; i < 64; ++i) b[i] = 0.25f * i - 3;
    w.add_tensor_f32("a", GGMLType::F32, {3}, a);
    w.add_tensor_f32("b", GGMLType::Q8_0, {32, 2}, b);
    w.add_tensor_f32("c", GGMLType::F16, {5, 1}, c);
    std::string bytes = w.bytes();
    auto f = parse(bytes);
    ASSERT_EQ(f->alignment(), align);
    ASSERT_EQ(f->tensors().size(), 3u);
    const auto* base = reinterpret_cast<const uint8_t*>(bytes.data());
    for (const TensorInfo& t : f->tensors()) {
      EXPECT_EQ(t.offset % align, 0u) << t.name;
      EXPECT_EQ((static_cast<const uint8_t*>(t.data) - base) % align, 0u) << t.name;
    }
    // Offsets in the spec's sense: each tensor starts at the previous end rounded up.
    auto up = [&](size_t x) { return (x + align - 1) / align * align; };
    EXPECT_EQ(f->tensor("a").offset, 0u);
    EXPECT_EQ(f->tensor("b").offset, up(12));
    EXPECT_EQ(f->tensor("c").offset, up(up(12) + 2 * 34));
    EXPECT_EQ(f->tensor("b").nbytes, 2u * 34);  // two q8_0 blocks of 34 bytes
    EXPECT_EQ(f->tensor("c").nbytes, 10u);
    EXPECT_EQ(f->tensor("c").ne, (std::vector<int64_t>{5, 1}));
    EXPECT_EQ(f->tensor_f32(f->tensor("a")), a);
    EXPECT_EQ(f->tensor_f32(f->tensor("c")), c);  // small integers are exact in f16
    EXPECT_EQ(bytes.size() % align, 0u);
  }
}

TEST(GGUFTensors, StreamingWriteEqualsInMemoryWrite) {
  std::vector<float> x(256 * 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1 * i);
  GGUFWriter mem, stream;
  for (GGUFWriter* w : {&mem, &stream}) {
    w->set("general.alignment", GGUFValue::u32(64));
    w->set("k", GGUFValue::str("v"));
  }
  mem.add_tensor_f32("x", GGMLType::Q4_K, {256, 3}, x);
  mem.add_tensor_f32("y", GGMLType::F32, {5}, {1, 2, 3, 4, 5});
  stream.add_tensor_deferred("x", GGMLType::Q4_K, {256, 3});
  stream.add_tensor_f32("y", GGMLType::F32, {5}, {1, 2, 3, 4, 5});
  const std::string path = ::testing::TempDir() + "kvslim_stream_" + std::to_string(::getpid()) + ".gguf";
  stream.write_streaming(path, [&](size_t i, std::string& out) {
    ASSERT_EQ(i, 0u);
    out.resize(3 * row_bytes(GGMLType::Q4_K, 256));
    for (int r = 0; r < 3; ++r) quantize_row(GGMLType::Q4_K, x.data() + 256 * r, &out[r * 144], 256);
  });
  EXPECT_TRUE(slurp(path) == mem.bytes());
  expect_error([&] { stream.bytes(); }, {"'x'", "deferred"});
  expect_error([&] { stream.write_streaming(path, [](size_t, std::string& out) { out = "short"; }); },
               {"'x'", "5 bytes"});
  std::remove(path.c_str());
}

TEST(GGUFTensors, RejectsMisalignedOffsetAndBadAlignment) {
  {
    GGUFWriter w;
    w.add_tensor_f32("a", GGMLType::F32, {8}, std::vector<float>(8, 1.0f));
    w.add_tensor_f32("b", GGMLType::F32, {8}, std::vector<float>(8, 2.0f));
    std::string bytes = w.bytes();
    poke<uint64_t>(bytes, tensor_type_offset(bytes, "b") + 4, 36);  // offset 36, not a multiple of 32
    expect_error([&] { parse(bytes, "mis.gguf"); }, {"mis.gguf", "tensor 'b'", "offset 36", "aligned"});
  }
  for (uint32_t bad : {0u, 3u, 48u, 1u << 21}) {
    GGUFWriter w;
    w.set("general.alignment", GGUFValue::u32(16));
    std::string bytes = w.bytes();
    poke<uint32_t>(bytes, find_gguf_string(bytes, "general.alignment") + 8 + 17 + 4, bad);
    expect_error([&] { parse(bytes, "al.gguf"); }, {"al.gguf", "general.alignment", std::to_string(bad)});
    GGUFWriter bad_writer;
    bad_writer.set("general.alignment", GGUFValue::u32(bad));
    expect_error([&] { bad_writer.bytes(); }, {"general.alignment", std::to_string(bad)});
  }
  std::string bytes;  // general.alignment as a string, by hand (the writer refuses it)
  put<uint32_t>(bytes, 0x46554747u);
  put<uint32_t>(bytes, 3);
  put<uint64_t>(bytes, 0);
  put<uint64_t>(bytes, 1);
  put_str(bytes, "general.alignment");
  put<uint32_t>(bytes, 8);
  put_str(bytes, "32");
  expect_error([&] { parse(bytes, "al.gguf"); }, {"al.gguf", "general.alignment", "integer"});
}

// ---- versions -----------------------------------------------------------------------------

TEST(GGUFVersion, V2ParsesLikeV3) {
  std::string v3 = slurp(kModel);
  ASSERT_GT(v3.size(), 1000u);
  std::string v2 = v3;
  poke<uint32_t>(v2, 4, 2);
  auto a = parse(v3), b = parse(v2);
  EXPECT_EQ(a->version(), 3u);
  EXPECT_EQ(b->version(), 2u);
  ASSERT_EQ(a->metadata().size(), b->metadata().size());
  for (size_t i = 0; i < a->metadata().size(); ++i) {
    EXPECT_EQ(a->metadata()[i].first, b->metadata()[i].first);
    // Same value: serialize both and compare bytes.
    GGUFWriter wa, wb;
    wa.set("k", a->metadata()[i].second);
    wb.set("k", b->metadata()[i].second);
    EXPECT_TRUE(wa.bytes() == wb.bytes()) << a->metadata()[i].first;
  }
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const TensorInfo &x = a->tensors()[i], &y = b->tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.ne, y.ne);
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(static_cast<const char*>(x.data) - v3.data(), static_cast<const char*>(y.data) - v2.data());
  }
}

TEST(GGUFVersion, OtherVersionsAreRejected) {
  for (uint32_t ver : {0u, 1u, 4u, 0x03000000u}) {
    std::string bytes = tiny_file();
    poke<uint32_t>(bytes, 4, ver);
    expect_error([&] { parse(bytes, "ver.gguf"); },
                 {"ver.gguf", "unsupported GGUF version " + std::to_string(ver)});
  }
}

// ---- malformed fields -------------------------------------------------------------------

TEST(GGUFErrors, BadMagic) {
  std::string bytes = tiny_file();
  bytes[0] = 'X';
  expect_error([&] { parse(bytes, "magic.gguf"); }, {"magic.gguf", "bad magic"});
  expect_error([&] { parse("GG", "short.gguf"); }, {"short.gguf", "magic"});
  expect_error([&] { parse("", "empty.gguf"); }, {"empty.gguf"});
}

TEST(GGUFErrors, MissingFileNamesThePath) {
  expect_error([] { GGUFFile::open("/nonexistent/dir/model.gguf"); },
               {"/nonexistent/dir/model.gguf", "cannot open"});
  expect_error([] { GGUFFile::open("/tmp"); }, {"/tmp", "not a regular file"});
}

// Regression: opening a FIFO waited for a writer forever (a press file or -m naming one hung).
TEST(GGUFErrors, FifoIsRefusedNotWaitedOn) {
  const std::string path = ::testing::TempDir() + "kvslim_fifo_" + std::to_string(getpid()) + ".gguf";
  ::unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  expect_error([&] { GGUFFile::open(path); }, {path, "not a regular file"});
  ::unlink(path.c_str());
}

TEST(GGUFErrors, UnknownTensorType) {
  for (uint32_t ty : {4u, 5u, 99u, 0xFFFFFFFFu}) {  // 4, 5: ggml's removed Q4_2/Q4_3
    std::string bytes = tiny_file();
    poke<uint32_t>(bytes, tensor_type_offset(bytes, "t"), ty);
    expect_error([&] { parse(bytes, "ty.gguf"); },
                 {"ty.gguf", "tensor 't'", "unknown tensor type " + std::to_string(ty)});
  }
}

TEST(GGUFErrors, UnknownValueType) {
  std::string bytes = tiny_file();
  size_t at = find_gguf_string(bytes, "general.name") + 8 + 12;
  ASSERT_EQ(peek<uint32_t>(bytes, at), 8u);  // STRING
  poke<uint32_t>(bytes, at, 13);
  expect_error([&] { parse(bytes, "vt.gguf"); }, {"vt.gguf", "'general.name'", "unknown value type 13"});

  GGUFWriter w;
  w.set("arr", GGUFValue::i32_array({1}));
  bytes = w.bytes();
  at = find_gguf_string(bytes, "arr") + 8 + 3 + 4;  // after the ARRAY type: the element type
  ASSERT_EQ(peek<uint32_t>(bytes, at), 5u);         // INT32
  poke<uint32_t>(bytes, at, 77);
  expect_error([&] { parse(bytes, "vt.gguf"); }, {"vt.gguf", "'arr'", "unknown array element type 77"});
}

TEST(GGUFErrors, TensorDataBeyondTheEnd) {
  std::string bytes = tiny_file();
  size_t off_at = tensor_type_offset(bytes, "t") + 4;
  poke<uint64_t>(bytes, off_at, 1u << 20);
  expect_error([&] { parse(bytes, "end.gguf"); }, {"end.gguf", "tensor 't'", "beyond the file end"});
  poke<uint64_t>(bytes, off_at, std::numeric_limits<uint64_t>::max() & ~uint64_t(31));  // overflow bait
  expect_error([&] { parse(bytes, "end.gguf"); }, {"end.gguf", "tensor 't'", "beyond the file end"});
  std::string cut = tiny_file();
  cut.resize(cut.size() - 32 + 15);  // drops the tensor's last byte (16 bytes data, padded to 32)
  expect_error([&] { parse(cut, "end.gguf"); }, {"end.gguf", "tensor 't'", "beyond the file end"});
}

TEST(GGUFErrors, DuplicateKeyAndTensor) {
  GGUFWriter w;
  w.set("key.a", GGUFValue::u32(1));
  w.set("key.b", GGUFValue::u32(2));
  w.add_tensor_f32("ta", GGMLType::F32, {1}, {1});
  w.add_tensor_f32("tb", GGMLType::F32, {1}, {2});
  std::string bytes = w.bytes();
  std::string dup_key = bytes;
  dup_key[find_gguf_string(dup_key, "key.b") + 8 + 4] = 'a';
  expect_error([&] { parse(dup_key, "dup.gguf"); }, {"dup.gguf", "duplicate key 'key.a'"});
  std::string dup_tensor = bytes;
  dup_tensor[find_gguf_string(dup_tensor, "tb") + 8 + 1] = 'a';
  expect_error([&] { parse(dup_tensor, "dup.gguf"); }, {"dup.gguf", "duplicate tensor 'ta'"});
}

TEST(GGUFErrors, AbsurdCountsAndLengths) {
  const uint64_t huge[] = {uint64_t(1) << 63, std::numeric_limits<uint64_t>::max(), uint64_t(1) << 40};
  for (uint64_t n : huge) {
    std::string base = tiny_file();
    std::string b = base;
    poke<uint64_t>(b, 8, n);
    expect_error([&] { parse(b, "n.gguf"); }, {"n.gguf", "tensor_count", std::to_string(n)});
    b = base;
    poke<uint64_t>(b, 16, n);
    expect_error([&] { parse(b, "n.gguf"); }, {"n.gguf", "metadata_kv_count", std::to_string(n)});
    b = base;  // length of the key string "general.name"
    poke<uint64_t>(b, find_gguf_string(b, "general.name"), n);
    expect_error([&] { parse(b, "n.gguf"); }, {"n.gguf", "metadata key #0", "string length " + std::to_string(n)});
    b = base;  // length of the value string "tiny"
    poke<uint64_t>(b, find_gguf_string(b, "tiny"), n);
    expect_error([&] { parse(b, "n.gguf"); }, {"n.gguf", "'general.name'", "string length " + std::to_string(n)});
    b = base;  // length of the tensor name
    poke<uint64_t>(b, find_gguf_string(b, "t"), n);
    expect_error([&] { parse(b, "n.gguf"); }, {"n.gguf", "tensor #0 name", "string length " + std::to_string(n)});
  }
  {  // array length
    GGUFWriter w;
    w.set("arr", GGUFValue::str_array({"x", "y"}));
    std::string b = w.bytes();
    size_t at = find_gguf_string(b, "arr") + 8 + 3 + 4 + 4;
    ASSERT_EQ(peek<uint64_t>(b, at), 2u);
    poke<uint64_t>(b, at, uint64_t(1) << 62);
    expect_error([&] { parse(b, "arr.gguf"); }, {"arr.gguf", "'arr' array length", "4611686018427387904"});
  }
  {  // dimension count and dimensions
    std::string b = tiny_file();
    size_t nd_at = find_gguf_string(b, "t") + 8 + 1;
    poke<uint32_t>(b, nd_at, 9);
    expect_error([&] { parse(b, "dim.gguf"); }, {"dim.gguf", "tensor 't'", "9 dimensions"});
    b = tiny_file();
    poke<int64_t>(b, nd_at + 4, int64_t(1) << 62);
    expect_error([&] { parse(b, "dim.gguf"); }, {"dim.gguf", "tensor 't'", "dimension 0 = 4611686018427387904"});
    b = tiny_file();
    poke<int64_t>(b, nd_at + 4, -4);
    expect_error([&] { parse(b, "dim.gguf"); }, {"dim.gguf", "tensor 't'", "dimension 0 = -4"});
  }
  {  // a partial block
    GGUFWriter w;
    w.add_tensor_f32("q", GGMLType::Q8_0, {32}, std::vector<float>(32, 1.0f));
    std::string b = w.bytes();
    poke<int64_t>(b, find_gguf_string(b, "q") + 8 + 1 + 4, 33);
    expect_error([&] { parse(b, "blk.gguf"); }, {"blk.gguf", "tensor 'q'", "33", "block size"});
  }
  {  // arrays nested too deeply
    GGUFValue v = GGUFValue::i32_array({1});
    for (int i = 0; i < 8; ++i) {
      GGUFValue outer = array_of(GGUFValueType::ARRAY);
      outer.arrays = {v};
      v = outer;
    }
    GGUFWriter w;
    w.set("deep", v);
    expect_error([&] { parse(w.bytes(), "deep.gguf"); }, {"deep.gguf", "'deep'", "nests arrays too deeply"});
  }
}

// ---- hostile input: truncation walk and byte-flip fuzz -------------------------------------

namespace {

/// Parses `bytes[0, n)` from an allocation of exactly n bytes (so AddressSanitizer sees any read
/// past the end). Returns true on a clean parse, false on kvslim::Error; anything else fails.
bool parses(const std::string& bytes, size_t n) {
  std::vector<uint8_t> buf(bytes.begin(), bytes.begin() + n);
  try {
    auto f = GGUFFile::from_memory(buf.data(), buf.size(), "cut.gguf");
    const uint8_t* lo = buf.data();
    const uint8_t* hi = buf.data() + buf.size();
    for (const TensorInfo& t : f->tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      EXPECT_TRUE(p >= lo && p + t.nbytes <= hi) << t.name;
    }
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
    return false;
  }
}

}  // namespace

TEST(GGUFHostile, EveryTruncationOfARealModel) {
  const std::string bytes = slurp(kModel);
  auto full = parse(bytes);
  size_t data_start = bytes.size(), data_end = 0;
  for (const TensorInfo& t : full->tensors()) {
    size_t at = static_cast<const char*>(t.data) - bytes.data();
    data_start = std::min(data_start, at - t.offset);
    data_end = std::max(data_end, at + t.nbytes);
  }
  ASSERT_GT(data_start, 1000u);
  ASSERT_LE(data_end, bytes.size());
  // Every cut inside the header, metadata and tensor infos is an error.
  for (size_t n = 0; n <= data_start; ++n) ASSERT_FALSE(parses(bytes, n)) << "cut at " << n;
  // Through the data: an error while any tensor's bytes are missing, a parse once they are all there.
  const size_t stride = 4099;
  std::vector<size_t> cuts;
  for (size_t n = data_start; n < bytes.size(); n += stride) cuts.push_back(n);
  cuts.push_back(data_end - 1);
  cuts.push_back(data_end);
  cuts.push_back(bytes.size() - 1);
  for (size_t n : cuts) EXPECT_EQ(parses(bytes, n), n >= data_end) << "cut at " << n;
  EXPECT_TRUE(parses(bytes, bytes.size()));
}

TEST(GGUFHostile, RandomByteFlipsInTheHeader) {
  std::string bytes = slurp(kModel);
  auto full = parse(bytes);
  size_t header_end = bytes.size();
  for (const TensorInfo& t : full->tensors())
    header_end = std::min<size_t>(header_end, static_cast<const char*>(t.data) - bytes.data() - t.offset);
  std::mt19937_64 rng(20240601);
  int clean = 0, errors = 0;
  const int kMutations = 3000;
  for (int it = 0; it < kMutations; ++it) {
    // 1 to 4 changes; half of them aimed at the first 64 bytes and the tensor infos, where
    // counts and offsets live, the rest anywhere in the header.
    const int k = 1 + static_cast<int>(rng() % 4);
    std::vector<std::pair<size_t, char>> saved;
    for (int j = 0; j < k; ++j) {
      size_t at;
      switch (rng() % 3) {
        case 0: at = rng() % 64; break;
        case 1: at = header_end - 1 - rng() % std::min<size_t>(header_end, 2048); break;
        default: at = rng() % header_end;
      }
      saved.emplace_back(at, bytes[at]);
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(bytes[at] ^ (1u << (rng() % 8))); break;
        case 1: bytes[at] = static_cast<char>(rng()); break;
        default: bytes[at] = static_cast<char>(rng() % 2 ? 0xFF : 0x00);
      }
    }
    try {
      auto f = GGUFFile::from_memory(bytes.data(), bytes.size(), "fuzz.gguf");
      for (const TensorInfo& t : f->tensors()) {
        const char* p = static_cast<const char*>(t.data);
        ASSERT_TRUE(p >= bytes.data() && p + t.nbytes <= bytes.data() + bytes.size()) << t.name;
      }
      ++clean;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("fuzz.gguf"), std::string::npos) << e.what();
      ++errors;
    }
    for (auto it2 = saved.rbegin(); it2 != saved.rend(); ++it2) bytes[it2->first] = it2->second;
  }
  // Both outcomes must be exercised, or the fuzz is not testing what it claims.
  EXPECT_GT(clean, kMutations / 20);
  EXPECT_GT(errors, kMutations / 20);
}
