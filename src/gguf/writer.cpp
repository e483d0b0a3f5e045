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
  tensors_.push_back({name, type, std::move(ne), std::move(data), want, false});
}

void GGUFWriter::add_tensor_deferred(const std::string& name, GGMLType type, std::vector<int64_t> ne) {
  int64_t nel = 1;
  for (int64_t e : ne) nel *= e;
  size_t want = row_bytes(type, ne.at(0)) * static_cast<size_t>(nel / ne.at(0));
  tensors_.push_back({name, type, std::move(ne), std::string(), want, true});
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

std::string GGUFWriter::header(std::vector<uint64_t>& offsets, size_t& alignment) const {
  alignment = 32;
  for (auto& kv : kv_)
    if (kv.first == "general.alignment") {
      const GGUFValue& a = kv.second;
      const bool is_signed = a.type == GGUFValueType::INT8 || a.type == GGUFValueType::INT16 ||
                             a.type == GGUFValueType::INT32 || a.type == GGUFValueType::INT64;
      const uint64_t al = is_signed ? static_cast<uint64_t>(a.i) : a.u;  // 0 for non-integer types
      if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
        throw Error(fmt::format("GGUFWriter: general.alignment = {} is not a power of two in [1, 2^20]", al));
      alignment = static_cast<size_t>(al);
    }
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
  offsets.clear();
  for (const Pending& t : tensors_) {
    put_str(out, t.name);
    put<uint32_t>(out, t.ne.size());
    for (int64_t e : t.ne) put<int64_t>(out, e);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset += (t.nbytes + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  return out;
}

std::string GGUFWriter::bytes() const {
  for (const Pending& t : tensors_)
    if (t.deferred)
      throw Error(fmt::format("GGUFWriter: tensor '{}' has deferred data; use write_streaming", t.name));
  std::vector<uint64_t> offsets;
  size_t alignment = 32;
  std::string out = header(offsets, alignment);
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

void GGUFWriter::write_streaming(const std::string& path,
                                 const std::function<void(size_t, std::string&)>& produce) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(fmt::format("{}: cannot open for writing", path));
  std::vector<uint64_t> offsets;
  size_t alignment = 32;
  const std::string head = header(offsets, alignment);
  f.write(head.data(), static_cast<std::streamsize>(head.size()));
  uint64_t written = 0;  // bytes of the data section so far
  std::string buf;
  const std::string zeros(alignment, '\0');
  for (size_t k = 0; k < tensors_.size(); ++k) {
    const Pending& t = tensors_[k];
    f.write(zeros.data(), static_cast<std::streamsize>(offsets[k] - written));
    const std::string* data = &t.data;
    if (t.deferred) {
      buf.clear();
      produce(k, buf);
      if (buf.size() != t.nbytes)
        throw Error(fmt::format("GGUFWriter: tensor '{}' was produced with {} bytes, its shape needs {}", t.name,
                                buf.size(), t.nbytes));
      data = &buf;
    }
    f.write(data->data(), static_cast<std::streamsize>(data->size()));
    written = offsets[k] + data->size();
    if (!f) throw Error(fmt::format("{}: write failed (tensor '{}')", path, t.name));
  }
  if (!tensors_.empty()) {
    uint64_t end = (written + alignment - 1) / alignment * alignment;
    f.write(zeros.data(), static_cast<std::streamsize>(end - written));
  }
  f.flush();
  if (!f) throw Error(fmt::format("{}: write failed", path));
}

}  // namespace kvslim
