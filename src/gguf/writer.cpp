// GGUF v3 writer: used by `kvslim synth`, the KVzap surrogate files and tests that need
// hand-made (or deliberately broken) model files.
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "kvslim/gguf.h"

namespace kvslim {

namespace {

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_str(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_scalar(std::string& out, GGUFValueType t, const GGUFValue& v, size_t idx, bool from_array) {
  auto sint = [&]() -> int64_t { return from_array ? v.ints[idx] : v.i; };
  auto uint = [&]() -> uint64_t { return from_array ? v.uints[idx] : v.u; };
  auto flt = [&]() -> double { return from_array ? v.floats[idx] : v.f; };
  switch (t) {
    case GGUFValueType::UINT8: put<uint8_t>(out, uint()); break;
    case GGUFValueType::INT8: put<int8_t>(out, sint()); break;
    case GGUFValueType::UINT16: put<uint16_t>(out, uint()); break;
    case GGUFValueType::INT16: put<int16_t>(out, sint()); break;
    case GGUFValueType::UINT32: put<uint32_t>(out, uint()); break;
    case GGUFValueType::INT32: put<int32_t>(out, sint()); break;
    case GGUFValueType::UINT64: put<uint64_t>(out, uint()); break;
    case GGUFValueType::INT64: put<int64_t>(out, sint()); break;
    case GGUFValueType::FLOAT32: put<float>(out, static_cast<float>(flt())); break;
    case GGUFValueType::FLOAT64: put<double>(out, flt()); break;
    case GGUFValueType::BOOL: put<uint8_t>(out, from_array ? (v.ints[idx] != 0) : v.b); break;
    case GGUFValueType::STRING: put_str(out, from_array ? v.strings[idx] : v.s); break;
    case GGUFValueType::ARRAY: break;
  }
}

void put_value(std::string& out, const GGUFValue& v) {
  if (v.type != GGUFValueType::ARRAY) {
    put_scalar(out, v.type, v, 0, false);
    return;
  }
  put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  put<uint64_t>(out, v.size());
  if (v.elem_type == GGUFValueType::ARRAY) {
    for (const GGUFValue& a : v.arrays) put_value(out, a);
    return;
  }
  for (size_t k = 0; k < v.size(); ++k) put_scalar(out, v.elem_type, v, k, true);
}

}  // namespace

void GGUFWriter::set(const std::string& key, GGUFValue v) {
  for (auto& kv : kv_)
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void GGUFWriter::add_tensor(const std::string& name, GGMLType type, std::vector<int64_t> ne, std::string data) {
  int64_t nel = 1;
  for (int64_t e : ne) nel *= e;
  size_t want = row_bytes(type, ne.at(0)) * static_cast<size_t>(nel / ne.at(0));
  if (data.size() != want)
    throw Error(fmt::format("GGUFWriter: tensor '{}' has {} bytes of data, its shape needs {}", name, data.size(),
                            want));
  tensors_.push_back({name, type, std::move(ne), std::move(data)});
}

void GGUFWriter::add_tensor_f32(const std::string& name, GGMLType type, std::vector<int64_t> ne,
                                const std::vector<float>& values) {
  int64_t nel = 1;
  for (int64_t e : ne) nel *= e;
  if (static_cast<int64_t>(values.size()) != nel)
    throw Error(fmt::format("GGUFWriter: tensor '{}' has {} values, its shape needs {}", name, values.size(), nel));
  size_t rb = row_bytes(type, ne.at(0));
  int64_t rows = nel / ne[0];
  std::string data(rb * rows, '\0');
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, values.data() + r * ne[0], data.data() + r * rb, ne[0]);
  add_tensor(name, type, std::move(ne), std::move(data));
}

std::string GGUFWriter::bytes() const {
  size_t alignment = 32;
  for (auto& kv : kv_)
    if (kv.first == "general.alignment") alignment = kv.second.u ? kv.second.u : static_cast<size_t>(kv.second.i);
  std::string out;
  put<uint32_t>(out, 0x46554747u);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (auto& kv : kv_) {
    put_str(out, kv.first);
    put<uint32_t>(out, static_cast<uint32_t>(kv.second.type));
    put_value(out, kv.second);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Pending& t : tensors_) {
    put_str(out, t.name);
    put<uint32_t>(out, t.ne.size());
    for (int64_t e : t.ne) put<int64_t>(out, e);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  size_t data_start = out.size();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out.resize(data_start + offsets[k], '\0');
    out += tensors_[k].data;
  }
  if (!tensors_.empty()) out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("{}: cannot open for writing", path));
  std::string b = bytes();
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
  if (!f) throw Error(fmt::format("{}: write failed", path));
}

}  // namespace kvslim
