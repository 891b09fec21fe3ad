// PyTorch .bin reader (pytorch_model.bin: torch.save of a state dict, the zip format PyTorch has
// written since 1.6). It never executes code: the pickle is read by the restricted unpickler of
// unpickler.h, which knows only what a state dict needs.
//
// The zip (read with minizip through an in-memory stream over the mapped file) holds
//   <archive>/data.pkl        the pickled state dict
//   <archive>/data/<key>      one entry per storage, stored uncompressed
//   <archive>/byteorder       "little" (torch >= 2.1; absent means the writer's native order)
//   <archive>/version, .format_version, .storage_alignment, .data/serialization_id  (ignored)
// Storage entries are used in place (no copy): minizip checks each entry's local header against
// the central directory and gives the offset of its data, which must be stored (not compressed),
// lie inside the file and be exactly as long as the storage the pickle declares. Each tensor's
// offset and strides are checked against its storage.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/file_image.h"
#include "io/unpickler.h"

namespace fdpp::torch_bin {

using torch_pickle::StorageRef;
using torch_pickle::TensorRecord;

class TorchBinFile {
 public:
  // Maps and validates the file; throws fdpp::Error "PATH: problem" on any defect, including
  // "PATH: refusing to load: the pickle calls os.system, which is not part of a state dict".
  // Reads no tensor data.
  static TorchBinFile open(const std::string& path);
  // Validates an image held in memory (tests, fuzzing); `name` stands for the path.
  static TorchBinFile from_bytes(std::string name, std::vector<uint8_t> bytes);

  const std::string& path() const { return image_.name(); }
  // The zip's top folder ("pytorch_model", "archive", ...).
  const std::string& archive_name() const { return archive_; }
  // In the state dict's order.
  const std::vector<TensorRecord>& tensors() const { return state_.tensors; }
  const TensorRecord* find(std::string_view name) const;  // nullptr when absent
  // The bytes of a storage entry inside the file.
  std::span<const uint8_t> storage_bytes(const std::string& key) const;
  // The tensor's bytes when it is contiguous in its storage (row-major, in its dtype), else an
  // empty span; and the offset of bytes inside the file (open() only: on_disk()).
  std::span<const uint8_t> contiguous_bytes(const TensorRecord& tensor) const;
  bool on_disk() const { return image_.on_disk(); }
  uint64_t file_offset_of(const uint8_t* p) const { return static_cast<uint64_t>(p - image_.bytes().data()); }
  // Converts the tensor to float32 into dst (dst.size() must equal n_elements), following its
  // strides. Throws fdpp::Error naming the file and tensor for a dtype other than F32/F16/BF16.
  void read_f32(const TensorRecord& tensor, std::span<float> dst) const;

 private:
  TorchBinFile() = default;
  void parse();
  FileImage image_;  // the mapped file, or the in-memory image of from_bytes()
  std::string archive_;
  torch_pickle::StateDict state_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_map<std::string, std::span<const uint8_t>> storage_data_;
};

}  // namespace fdpp::torch_bin
