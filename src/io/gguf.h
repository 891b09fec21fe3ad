// GGUF (v2, v3) reader: header, metadata of every value type, tensor infos, alignment, and the
// tensor data as spans into the memory-mapped file. Every count, length, offset and size read from
// the file is checked against the file's size before it is used, so a hostile file can cause
// neither an out-of-bounds read nor an allocation larger than the file justifies.
// Format reference: ggml's docs/gguf.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/file_image.h"

namespace fdpp::gguf {

// ggml tensor types (the numeric values are the file format's).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

// Name of a type ("Q4_1"), or "type#N" for a number fdpp does not know.
std::string type_name(GgmlType type);
// Whether fdpp knows this type number: its name and block layout (every enumerator above). Files
// holding tensors of a known type parse; only dequantize() needs a supported one.
bool is_known(GgmlType type);
// Whether fdpp can dequantize this type to float: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
bool is_supported(GgmlType type);
// Elements per block and bytes per block of a known type (F32: 1 and 4; Q4_1: 32 and 20).
// Throw fdpp::Error for an unknown type number.
uint64_t block_elements(GgmlType type);
uint64_t block_bytes(GgmlType type);

// Dequantizes n elements (n a multiple of block_elements(type)) from src into dst.
// Throws fdpp::Error for an unsupported type or a bad n.
void dequantize(GgmlType type, const uint8_t* src, float* dst, uint64_t n);

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
// "U32", "STRING", ...; "value_type#N" for an unknown number.
std::string value_type_name(ValueType type);

// One metadata value. Arrays are stored typed (a vector of the element type), since tokenizer
// vocabularies hold 10^5 entries. Nested arrays (allowed by the format, unused by models) are
// stored as a vector of Value.
struct Value;
using ValueArray = std::vector<Value>;
struct Value {
  ValueType type;
  ValueType element_type = ValueType::U8;  // for ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string,  // scalars (ints widened)
               std::vector<std::string>, std::vector<int64_t>, std::vector<uint64_t>,
               std::vector<double>, std::vector<bool>, ValueArray>
      data;
};

// A short human-readable rendering of a value for `fdpp info`: scalars as themselves, strings
// quoted (cut at 60 bytes), arrays as "[N x TYPE: a, b, c, ...]" with at most max_elements shown.
std::string format_value(const Value& value, size_t max_elements = 8);

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous (fastest) axis
  GgmlType type;
  uint64_t offset;   // absolute byte offset in the file (data section start + relative offset)
  uint64_t n_elements;
  uint64_t n_bytes;
};

class GgufFile {
 public:
  // Maps and parses the whole description; throws fdpp::Error with "PATH: problem" on any defect.
  // Tensor data is not read (only its extent is checked against the file size).
  static GgufFile open(const std::string& path);
  // Parses a GGUF image held in memory (tests, the fuzzer: a heap buffer lets AddressSanitizer see
  // any read past the end, which a mapping's last page would hide). `name` stands for the path.
  static GgufFile from_bytes(std::string name, std::vector<uint8_t> bytes);

  const std::string& path() const { return image_.name(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return image_.bytes().size(); }
  // Absolute byte offset of the tensor data section (aligned end of the tensor infos).
  uint64_t data_offset() const { return data_offset_; }

  const Value* find(std::string_view key) const;  // nullptr when absent
  const std::vector<std::string>& keys() const { return keys_; }  // in file order

  // Typed getters. Each throws "PATH: metadata KEY missing" or "... has type X, expected Y".
  // Integer getters accept any integer type whose value fits; float getters accept F32/F64.
  uint64_t get_uint(std::string_view key) const;
  uint64_t get_uint(std::string_view key, uint64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, const std::string& fallback) const;
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;   // F32/F64 arrays
  std::vector<int64_t> get_int_array(std::string_view key) const;    // any integer array

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
  // The raw bytes of a tensor inside the mapped file.
  std::span<const uint8_t> tensor_bytes(const TensorInfo& info) const;
  // Whether the file is on disk (open()), so that TensorInfo::offset can be read with pread.
  bool on_disk() const { return image_.on_disk(); }
  // For a caller that has read all it needs from the description (the loader, once the tokenizer
  // and the weights are built): frees the parsed metadata (a tokenizer's vocabulary and merges,
  // 3.5 MB for the default model) and drops the description's pages of a mapped file, which would
  // otherwise stay resident for the whole run. Afterwards no key is found; tensors stay readable.
  void release_metadata();
  // Dequantizes a whole tensor to float32 into dst (dst.size() must equal n_elements).
  void read_f32(const TensorInfo& info, std::span<float> dst) const;

 private:
  GgufFile() = default;
  void parse();
  FileImage image_;  // the mapped file, or the in-memory image of from_bytes()
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, Value> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace fdpp::gguf
