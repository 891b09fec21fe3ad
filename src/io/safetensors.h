// safetensors reader (HF's format: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and [begin, end) byte span in the data section that follows, then the data).
// The file is memory-mapped; the header is checked whole before anything is used: its length against
// the file (and a 100 MB cap, the reference implementation's, before any allocation), every span
// inside the data section and exactly numel * dtype size long, no two spans overlapping.
// Format reference: the safetensors project's README ("Format").
//
// Also home of the dtype table shared by the HF readers (torch_bin.h names dtypes the same way).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/file_image.h"

namespace fdpp::hf {

// Bits per element of a dtype as safetensors names it ("F32" 32, "BF16" 16, "BOOL" 8, "F4" 4, ...);
// 0 for a name fdpp does not know. Known dtypes: BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16,
// BF16, F32, F64, C64, F8_E4M3, F8_E5M2, F8_E8M0, F4, F6_E2M3, F6_E3M2.
uint32_t dtype_bits(std::string_view dtype);
// Whether to_f32 can convert it: F32, F16, BF16.
bool dtype_readable(std::string_view dtype);
// Converts n elements of a readable dtype at src (any alignment) to float (exact for all three);
// OpenMP-parallel for large n. Throws fdpp::Error "dtype X not supported" for any other dtype.
void to_f32(std::string_view dtype, const uint8_t* src, float* dst, uint64_t n);

// A name, key or value from a file as shown in an error message: control bytes escaped so that
// the message stays one line, long text cut.
std::string shown(std::string_view s);

}  // namespace fdpp::hf

namespace fdpp::safetensors {

// Largest header accepted (bytes), as in the reference implementation (MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::string dtype;            // safetensors name: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;   // row-major, outermost first
  uint64_t n_elements = 0;
  uint64_t offset = 0;          // absolute byte offset in the file
  uint64_t n_bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws fdpp::Error "PATH: problem" on any defect. Reads no tensor
  // data (only checks its extent).
  static SafetensorsFile open(const std::string& path);
  // Validates an image held in memory (tests, the fuzzer); `name` stands for the path.
  static SafetensorsFile from_bytes(std::string name, std::vector<uint8_t> bytes);

  const std::string& path() const { return image_.name(); }
  uint64_t file_size() const { return image_.bytes().size(); }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length
  // In the order of their data in the file.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // The "__metadata__" entries (string to string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  std::span<const uint8_t> tensor_bytes(const TensorInfo& info) const;
  // Whether the file is on disk (open()), so that TensorInfo::offset can be read with pread.
  bool on_disk() const { return image_.on_disk(); }
  // Converts the tensor to float32 into dst (dst.size() must equal n_elements). Throws fdpp::Error
  // naming the file and tensor for a dtype other than F32/F16/BF16 or a size mismatch.
  void read_f32(const TensorInfo& info, std::span<float> dst) const;

 private:
  SafetensorsFile() = default;
  void parse();
  FileImage image_;  // the mapped file, or the in-memory image of from_bytes()
  uint64_t data_offset_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fdpp::safetensors
