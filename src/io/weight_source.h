// A set of named tensors on disk, whatever the container: HF safetensors (one file or shards with
// model.safetensors.index.json) or PyTorch .bin (zip of pickled state dict, one or sharded).
// Model files map names from here into DecoderWeights; nothing here knows about architectures.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major, outermost first (as torch shows it)
  std::string dtype;           // "F32", "F16", "BF16" (others are listed but cannot be read)
  uint64_t n_bytes = 0;
  std::string file;            // the file (shard) that holds it
};

// A tensor's bytes where they lie: data inside the file's mapping (or an in-memory image), and,
// when that is a file on disk, the same bytes' path and absolute offset (file empty otherwise).
struct RawTensorBytes {
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  std::string file;
  uint64_t file_offset = 0;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The directory or file the tensors come from (for error messages).
  virtual const std::string& origin() const = 0;
  virtual std::string format() const = 0;  // "safetensors" or "pytorch"
  virtual const std::vector<SourceTensor>& tensors() const = 0;
  // nullptr when absent.
  virtual const SourceTensor* find(std::string_view name) const = 0;
  // Converts the tensor to float32 into dst (dst.size() must equal its element count). Throws
  // fdpp::Error naming the file and tensor for an unsupported dtype or a size mismatch.
  virtual void read_f32(const SourceTensor& tensor, std::span<float> dst) const = 0;
  // The tensor's bytes in place, row-major and contiguous in its stored dtype, without reading
  // them; data is null when it is not stored that way (a strided PyTorch view), or for a source
  // that cannot say. The GPU loader streams from these; read_f32 is its fallback.
  virtual RawTensorBytes raw_bytes(const SourceTensor& tensor) const {
    (void)tensor;
    return {};
  }
};

// Opens the weights of an HF model directory: model.safetensors, or model.safetensors.index.json
// with its shards, or pytorch_model.bin, or pytorch_model.bin.index.json with its shards (in that
// order of preference). Validates every header; reads no tensor data. Throws fdpp::Error ("DIR:
// no weights found (looked for ...)", "FILE: ...") on any defect.
std::unique_ptr<WeightSource> open_hf_weights(const std::string& directory);

}  // namespace fdpp
