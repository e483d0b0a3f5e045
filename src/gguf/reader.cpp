// GGUF reader: the file is mapped read-only and parsed with a bounds-checked cursor, so no
// header value (count, length, offset) can make us read outside the mapping.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "kvslim/gguf.h"

namespace kvslim {

const char* value_type_name(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: return "uint8";
    case GGUFValueType::INT8: return "int8";
    case GGUFValueType::UINT16: return "uint16";
    case GGUFValueType::INT16: return "int16";
    case GGUFValueType::UINT32: return "uint32";
    case GGUFValueType::INT32: return "int32";
    case GGUFValueType::FLOAT32: return "float32";
    case GGUFValueType::BOOL: return "bool";
    case GGUFValueType::STRING: return "string";
    case GGUFValueType::ARRAY: return "array";
    case GGUFValueType::UINT64: return "uint64";
    case GGUFValueType::INT64: return "int64";
    case GGUFValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

size_t GGUFValue::size() const {
  if (type != GGUFValueType::ARRAY) return 0;
  return ints.size() + uints.size() + floats.size() + strings.size() + arrays.size();
}

GGUFValue GGUFValue::str(std::string v) {
  GGUFValue r;
  r.type = GGUFValueType::STRING;
  r.s = std::move(v);
  return r;
}
GGUFValue GGUFValue::u32(uint32_t v) {
  GGUFValue r;
  r.type = GGUFValueType::UINT32;
  r.u = v;
  return r;
}
GGUFValue GGUFValue::i32(int32_t v) {
  GGUFValue r;
  r.type = GGUFValueType::INT32;
  r.i = v;
  return r;
}
GGUFValue GGUFValue::u64(uint64_t v) {
  GGUFValue r;
  r.type = GGUFValueType::UINT64;
  r.u = v;
  return r;
}
GGUFValue GGUFValue::f32(float v) {
  GGUFValue r;
  r.type = GGUFValueType::FLOAT32;
  r.f = v;
  return r;
}
GGUFValue GGUFValue::boolean(bool v) {
  GGUFValue r;
  r.type = GGUFValueType::BOOL;
  r.b = v;
  return r;
}
GGUFValue GGUFValue::str_array(std::vector<std::string> v) {
  GGUFValue r;
  r.type = GGUFValueType::ARRAY;
  r.elem_type = GGUFValueType::STRING;
  r.strings = std::move(v);
  return r;
}
GGUFValue GGUFValue::f32_array(std::vector<float> v) {
  GGUFValue r;
  r.type = GGUFValueType::ARRAY;
  r.elem_type = GGUFValueType::FLOAT32;
  r.floats.assign(v.begin(), v.end());
  return r;
}
GGUFValue GGUFValue::i32_array(std::vector<int32_t> v) {
  GGUFValue r;
  r.type = GGUFValueType::ARRAY;
  r.elem_type = GGUFValueType::INT32;
  r.ints.assign(v.begin(), v.end());
  return r;
}

int64_t TensorInfo::nelements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

namespace {

bool is_signed_int(GGUFValueType t) {
  return t == GGUFValueType::INT8 || t == GGUFValueType::INT16 || t == GGUFValueType::INT32 ||
         t == GGUFValueType::INT64;
}
bool is_unsigned_int(GGUFValueType t) {
  return t == GGUFValueType::UINT8 || t == GGUFValueType::UINT16 || t == GGUFValueType::UINT32 ||
         t == GGUFValueType::UINT64;
}
bool is_float(GGUFValueType t) { return t == GGUFValueType::FLOAT32 || t == GGUFValueType::FLOAT64; }

/// Bounds-checked little-endian reader over the mapping. Every failure names the file and the
/// field being read (`what`), and the offset where it starts.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  size_t pos() const { return pos_; }
  void need(size_t k, const std::string& what) const {
    if (k > n_ - pos_)
      throw Error(fmt::format("{}: truncated GGUF: {} needs {} bytes at offset {}, file has {}", path_, what, k,
                              pos_, n_));
  }
  template <class T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const std::string& what) {
    uint64_t len = get<uint64_t>(what + " (string length)");
    // Checked before allocating, so a hostile length (2^63) is an error, not a bad_alloc.
    if (len > n_ - pos_)
      throw Error(fmt::format("{}: truncated or corrupt GGUF: {} has string length {} at offset {}, only {} bytes "
                              "left in the file",
                              path_, what, len, pos_ - 8, n_ - pos_));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  /// An element count: must be payable by the remaining bytes at `min_elem` bytes each.
  uint64_t count(const std::string& what, size_t min_elem) {
    uint64_t c = get<uint64_t>(what);
    if (min_elem > 0 && c > (n_ - pos_) / min_elem)
      throw Error(fmt::format("{}: truncated or corrupt GGUF: {} = {} at offset {} needs at least {} bytes each, "
                              "only {} bytes left in the file",
                              path_, what, c, pos_ - 8, min_elem, n_ - pos_));
    return c;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& path_;
};

size_t scalar_size(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::BOOL: return 1;
    case GGUFValueType::UINT16: case GGUFValueType::INT16: return 2;
    case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::FLOAT32: return 4;
    case GGUFValueType::UINT64: case GGUFValueType::INT64: case GGUFValueType::FLOAT64: return 8;
    case GGUFValueType::STRING: return 8;  // at least the length prefix
    case GGUFValueType::ARRAY: return 12;  // at least type + count
  }
  return 0;
}

void read_scalar(Cursor& c, GGUFValueType t, GGUFValue& v, const std::string& what) {
  switch (t) {
    case GGUFValueType::UINT8: v.u = c.get<uint8_t>(what); break;
    case GGUFValueType::INT8: v.i = c.get<int8_t>(what); break;
    case GGUFValueType::UINT16: v.u = c.get<uint16_t>(what); break;
    case GGUFValueType::INT16: v.i = c.get<int16_t>(what); break;
    case GGUFValueType::UINT32: v.u = c.get<uint32_t>(what); break;
    case GGUFValueType::INT32: v.i = c.get<int32_t>(what); break;
    case GGUFValueType::UINT64: v.u = c.get<uint64_t>(what); break;
    case GGUFValueType::INT64: v.i = c.get<int64_t>(what); break;
    case GGUFValueType::FLOAT32: v.f = c.get<float>(what); break;
    case GGUFValueType::FLOAT64: v.f = c.get<double>(what); break;
    case GGUFValueType::BOOL: {
      uint8_t b = c.get<uint8_t>(what);
      v.b = b != 0;
      break;
    }
    case GGUFValueType::STRING: v.s = c.str(what); break;
    case GGUFValueType::ARRAY: break;
  }
}

// `field` names the value in messages ("metadata 'general.name'").
void read_value(Cursor& c, GGUFValueType t, GGUFValue& v, const std::string& field, const std::string& path,
                int depth) {
  v.type = t;
  if (t != GGUFValueType::ARRAY) {
    read_scalar(c, t, v, field);
    return;
  }
  if (depth > 4) throw Error(fmt::format("{}: corrupt GGUF: {} nests arrays too deeply", path, field));
  uint32_t et = c.get<uint32_t>(field + " (array element type)");
  if (et > static_cast<uint32_t>(GGUFValueType::FLOAT64))
    throw Error(fmt::format("{}: corrupt GGUF: {} has unknown array element type {}", path, field, et));
  v.elem_type = static_cast<GGUFValueType>(et);
  uint64_t n = c.count(field + " array length", scalar_size(v.elem_type));
  GGUFValue tmp;
  for (uint64_t k = 0; k < n; ++k) {
    if (v.elem_type == GGUFValueType::ARRAY) {
      GGUFValue inner;
      read_value(c, GGUFValueType::ARRAY, inner, field, path, depth + 1);
      v.arrays.push_back(std::move(inner));
      continue;
    }
    read_scalar(c, v.elem_type, tmp, field);
    if (is_signed_int(v.elem_type)) v.ints.push_back(tmp.i);
    else if (is_unsigned_int(v.elem_type)) v.uints.push_back(tmp.u);
    else if (is_float(v.elem_type)) v.floats.push_back(tmp.f);
    else if (v.elem_type == GGUFValueType::BOOL) v.ints.push_back(tmp.b ? 1 : 0);
    else v.strings.push_back(std::move(tmp.s));
  }
}

}  // namespace

GGUFFile::~GGUFFile() {
  if (map_) munmap(map_, size_);
}

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO or a device must be refused below, not waited on here.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("{}: cannot open model file: {}", path, std::strerror(errno)));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path));
  }
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      throw Error(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  f->parse();
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::from_bytes(const std::string& bytes, const std::string& label) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = label;
  f->owned_ = bytes;
  f->base_ = reinterpret_cast<const uint8_t*>(f->owned_.data());
  f->size_ = f->owned_.size();
  f->parse();
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::from_memory(const void* data, size_t size, const std::string& label) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = label;
  f->base_ = static_cast<const uint8_t*>(data);
  f->size_ = size;
  f->parse();
  return f;
}

void GGUFFile::parse() {
  Cursor c(base_, size_, path_);
  if (size_ < 4) throw Error(fmt::format("{}: not a GGUF file: {} bytes, too short for the magic", path_, size_));
  uint32_t magic = c.get<uint32_t>("magic");
  if (magic != 0x46554747u)  // "GGUF" little-endian
    throw Error(fmt::format("{}: not a GGUF file (bad magic 0x{:08x})", path_, magic));
  version_ = c.get<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw Error(fmt::format("{}: unsupported GGUF version {} (2 and 3 are supported)", path_, version_));
  uint64_t n_tensors = c.count("tensor_count", 24);
  uint64_t n_kv = c.count("metadata_kv_count", 12);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.str(fmt::format("metadata key #{}", k));
    const std::string field = fmt::format("metadata '{}'", printable(key));
    uint32_t t = c.get<uint32_t>(field + " (value type)");
    if (t > static_cast<uint32_t>(GGUFValueType::FLOAT64))
      throw Error(fmt::format("{}: corrupt GGUF: {} has unknown value type {}", path_, field, t));
    GGUFValue v;
    read_value(c, static_cast<GGUFValueType>(t), v, field, path_, 0);
    if (kv_index_.count(key)) throw Error(fmt::format("{}: corrupt GGUF: duplicate key '{}'", path_, printable(key)));
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GGUFValue* a = find("general.alignment")) {
    uint64_t al = is_signed_int(a->type) ? static_cast<uint64_t>(a->i) : a->u;
    if (!is_unsigned_int(a->type) && !is_signed_int(a->type))
      throw Error(fmt::format("{}: general.alignment must be an integer, got {}", path_, value_type_name(a->type)));
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
      throw Error(fmt::format("{}: general.alignment = {} is not a power of two in [1, 2^20]", path_, al));
    alignment_ = static_cast<size_t>(al);
  }

  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti;
    ti.name = c.str(fmt::format("tensor #{} name", k));
    const std::string field = fmt::format("tensor '{}'", printable(ti.name));
    uint32_t nd = c.get<uint32_t>(field + " (dimension count)");
    if (nd == 0 || nd > 4)
      throw Error(fmt::format("{}: tensor '{}' has {} dimensions (1 to 4 allowed)", path_, printable(ti.name), nd));
    for (uint32_t d = 0; d < nd; ++d) {
      int64_t e = c.get<int64_t>(field + " (dimensions)");
      if (e <= 0 || e > (int64_t(1) << 40))
        throw Error(fmt::format("{}: tensor '{}' has invalid dimension {} = {}", path_, printable(ti.name), d, e));
      ti.ne.push_back(e);
    }
    uint32_t ty = c.get<uint32_t>(field + " (type)");
    ti.type = static_cast<GGMLType>(ty);
    const TypeTraits* tr = type_traits(ti.type);
    if (!tr || tr->type_size == 0)
      throw Error(fmt::format("{}: tensor '{}' has unknown tensor type {}", path_, printable(ti.name), ty));
    ti.offset = c.get<uint64_t>(field + " (offset)");
    // Element count with overflow guard (each dimension is at most 2^40 but products can overflow).
    __int128 nel = 1;
    for (int64_t e : ti.ne) {
      nel *= e;
      if (nel > (__int128(1) << 50))
        throw Error(fmt::format("{}: tensor '{}' is impossibly large", path_, printable(ti.name)));
    }
    if (ti.ne[0] % tr->block_size != 0)
      throw Error(fmt::format("{}: tensor '{}' row of {} elements is not a multiple of the {} block size {}",
                              path_, printable(ti.name), ti.ne[0], tr->name, tr->block_size));
    ti.nbytes = static_cast<size_t>(nel / tr->block_size * tr->type_size);
    if (tensor_index_.count(ti.name))
      throw Error(fmt::format("{}: corrupt GGUF: duplicate tensor '{}'", path_, printable(ti.name)));
    tensor_index_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }

  size_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > size_)
    throw Error(fmt::format("{}: truncated GGUF: tensor data section starts at {} but file has {} bytes", path_,
                            data_start, size_));
  for (TensorInfo& ti : tensors_) {
    if (ti.offset % alignment_ != 0)
      throw Error(fmt::format("{}: tensor '{}' offset {} is not aligned to {}", path_, printable(ti.name), ti.offset,
                              alignment_));
    if (ti.offset > size_ - data_start || ti.nbytes > size_ - data_start - ti.offset)
      throw Error(fmt::format("{}: truncated GGUF: tensor '{}' data [{}, +{}) lies beyond the file end", path_,
                              printable(ti.name), data_start + ti.offset, ti.nbytes));
    ti.data = base_ + data_start + ti.offset;
  }
}

const GGUFValue* GGUFFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

std::string GGUFFile::get_string(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (v->type != GGUFValueType::STRING)
    throw Error(fmt::format("{}: metadata key '{}' should be a string, is {}", path_, key, value_type_name(v->type)));
  return v->s;
}

int64_t GGUFFile::get_int(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (is_signed_int(v->type)) return v->i;
  if (is_unsigned_int(v->type)) {
    if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(fmt::format("{}: metadata key '{}' value {} is out of range", path_, key, v->u));
    return static_cast<int64_t>(v->u);
  }
  if (v->type == GGUFValueType::BOOL) return v->b ? 1 : 0;
  throw Error(fmt::format("{}: metadata key '{}' should be an integer, is {}", path_, key, value_type_name(v->type)));
}

int64_t GGUFFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (is_float(v->type)) return v->f;
  if (is_signed_int(v->type)) return static_cast<double>(v->i);
  if (is_unsigned_int(v->type)) return static_cast<double>(v->u);
  throw Error(fmt::format("{}: metadata key '{}' should be a number, is {}", path_, key, value_type_name(v->type)));
}

double GGUFFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GGUFFile::get_bool(const std::string& key, bool fallback) const {
  const GGUFValue* v = find(key);
  if (!v) return fallback;
  if (v->type == GGUFValueType::BOOL) return v->b;
  if (is_signed_int(v->type)) return v->i != 0;
  if (is_unsigned_int(v->type)) return v->u != 0;
  throw Error(fmt::format("{}: metadata key '{}' should be a bool, is {}", path_, key, value_type_name(v->type)));
}

std::vector<std::string> GGUFFile::get_string_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (v->type != GGUFValueType::ARRAY || v->elem_type != GGUFValueType::STRING)
    throw Error(fmt::format("{}: metadata key '{}' should be an array of strings", path_, key));
  return v->strings;
}

std::vector<float> GGUFFile::get_float_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (v->type != GGUFValueType::ARRAY)
    throw Error(fmt::format("{}: metadata key '{}' should be an array of numbers", path_, key));
  std::vector<float> out;
  if (is_float(v->elem_type)) out.assign(v->floats.begin(), v->floats.end());
  else if (is_signed_int(v->elem_type)) out.assign(v->ints.begin(), v->ints.end());
  else if (is_unsigned_int(v->elem_type)) out.assign(v->uints.begin(), v->uints.end());
  else throw Error(fmt::format("{}: metadata key '{}' should be an array of numbers", path_, key));
  return out;
}

std::vector<int32_t> GGUFFile::get_int_array(const std::string& key) const {
  const GGUFValue* v = find(key);
  if (!v) throw Error(fmt::format("{}: missing metadata key '{}'", path_, key));
  if (v->type != GGUFValueType::ARRAY)
    throw Error(fmt::format("{}: metadata key '{}' should be an array of integers", path_, key));
  std::vector<int32_t> out;
  if (is_signed_int(v->elem_type) || v->elem_type == GGUFValueType::BOOL)
    for (int64_t x : v->ints) out.push_back(static_cast<int32_t>(x));
  else if (is_unsigned_int(v->elem_type))
    for (uint64_t x : v->uints) out.push_back(static_cast<int32_t>(x));
  else throw Error(fmt::format("{}: metadata key '{}' should be an array of integers", path_, key));
  return out;
}

const TensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GGUFFile::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw Error(fmt::format("{}: missing tensor '{}'", path_, name));
  return *t;
}

std::vector<float> GGUFFile::tensor_f32(const TensorInfo& t) const {
  const TypeTraits* tr = type_traits(t.type);
  if (!tr || !tr->supported)
    throw Error(fmt::format("{}: tensor '{}' has type {} which cannot be converted to f32", path_, t.name,
                            type_name(t.type)));
  std::vector<float> out(static_cast<size_t>(t.nelements()));
  int64_t rows = t.nelements() / t.ne[0];
  size_t rb = row_bytes(t.type, t.ne[0]);
  const uint8_t* p = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t.type, p + r * rb, out.data() + r * t.ne[0], t.ne[0]);
  return out;
}

}  // namespace kvslim
