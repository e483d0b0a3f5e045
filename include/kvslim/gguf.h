#pragma once
// GGUF v2/v3 reading (mmap) and writing. Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/quant.h"

namespace kvslim {

/// Metadata value types, numbered as in the GGUF specification.
enum class GGUFValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(GGUFValueType t);

/// One metadata value. Scalars of integer types live in `i` (signed) or `u` (unsigned), floats
/// in `f`, bools in `b`, strings in `s`. Arrays: `elem_type` and one of the vectors below
/// (integers -> ints/uints, floats -> floats, bool -> ints, strings -> strings); nested arrays
/// are kept in `arrays`.
struct GGUFValue {
  GGUFValueType type = GGUFValueType::UINT32;
  GGUFValueType elem_type = GGUFValueType::UINT32;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<uint64_t> uints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GGUFValue> arrays;
  /// Number of elements for an array value, 0 otherwise.
  size_t size() const;

  static GGUFValue str(std::string v);
  static GGUFValue u32(uint32_t v);
  static GGUFValue i32(int32_t v);
  static GGUFValue u64(uint64_t v);
  static GGUFValue f32(float v);
  static GGUFValue boolean(bool v);
  static GGUFValue str_array(std::vector<std::string> v);
  static GGUFValue f32_array(std::vector<float> v);
  static GGUFValue i32_array(std::vector<int32_t> v);
};

/// A tensor as described by the file: ne[0] is the fastest-moving dimension (ggml order).
struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;  ///< from the start of the data section, bytes
  size_t nbytes = 0;
  const void* data = nullptr;  ///< points into the mapping
  int64_t nelements() const;
};

/// A GGUF file mapped read-only. Every offset and length in the header is checked against the
/// file size, so a truncated or hostile file raises kvslim::Error (naming the file and the field)
/// rather than crashing.
class GGUFFile {
 public:
  /// Opens and parses `path`. Throws kvslim::Error (missing file, bad magic, unsupported version,
  /// truncation, out-of-range tensor data, unknown tensor type, ...).
  static std::unique_ptr<GGUFFile> open(const std::string& path);
  /// Parses an in-memory image (copied). Same errors as open(); `label` names it in messages.
  static std::unique_ptr<GGUFFile> from_bytes(const std::string& bytes, const std::string& label);
  /// Parses `size` bytes at `data` without copying them: the caller keeps the memory alive and
  /// unchanged for the life of the returned object (tensor data pointers point into it).
  /// Same errors as open(); `label` names the image in messages.
  static std::unique_ptr<GGUFFile> from_memory(const void* data, size_t size, const std::string& label);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }

  const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
  const GGUFValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters. Missing key or incompatible type -> kvslim::Error naming file and key.
  // Integer getters accept any integer type whose value fits; float getters accept any number.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int32_t> get_int_array(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  /// Tensor by name; missing -> kvslim::Error naming file and tensor.
  const TensorInfo& tensor(const std::string& name) const;
  /// Whole tensor converted to f32 (dequantized).
  std::vector<float> tensor_f32(const TensorInfo& t) const;

 private:
  GGUFFile() = default;
  void parse();
  std::string path_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;       // mmap'd region (or nullptr)
  std::string owned_;         // in-memory image for from_bytes
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

/// Builds a GGUF v3 file: metadata in insertion order, tensors aligned to `general.alignment`
/// (32 unless set). Tensor data is given already encoded in its type (see quantize_row).
class GGUFWriter {
 public:
  void set(const std::string& key, GGUFValue v);
  /// `ne` in ggml order; `data` must hold row_bytes(type, ne[0]) * (rows) bytes.
  void add_tensor(const std::string& name, GGMLType type, std::vector<int64_t> ne, std::string data);
  /// Convenience: f32 data converted to `type` row by row.
  void add_tensor_f32(const std::string& name, GGMLType type, std::vector<int64_t> ne,
                      const std::vector<float>& values);
  /// Declares a tensor whose encoded bytes are produced only while the file is written by
  /// write_streaming, so a model larger than memory can be written tensor by tensor.
  void add_tensor_deferred(const std::string& name, GGMLType type, std::vector<int64_t> ne);
  /// Serialized file image. Throws kvslim::Error if a tensor was added with add_tensor_deferred.
  std::string bytes() const;
  /// Writes to `path`; I/O failure -> kvslim::Error.
  void write(const std::string& path) const;
  /// Writes to `path`, calling `produce(i, out)` for each deferred tensor i (its index among all
  /// tensors, in the order added) to fill `out` with exactly its encoded bytes. Only one tensor's
  /// data is held at a time. I/O failure or a wrong size -> kvslim::Error.
  void write_streaming(const std::string& path,
                       const std::function<void(size_t index, std::string& out)>& produce) const;

 private:
  struct Pending {
    std::string name;
    GGMLType type;
    std::vector<int64_t> ne;
    std::string data;
    size_t nbytes = 0;
    bool deferred = false;
  };
  /// Header, tensor infos and padding up to the data section; fills the data offsets.
  std::string header(std::vector<uint64_t>& offsets, size_t& alignment) const;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Pending> tensors_;
};

}  // namespace kvslim
