// The bytes of a file being parsed: a read-only mapping of a file on disk, or an image held in
// memory (fuzzers and tests parse from memory so that sanitizers see every over-read). Either
// way bytes() keeps its address when the object moves, so parsed spans into it stay valid.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace fdpp {

class FileImage {
 public:
  FileImage() = default;
  static FileImage map(const std::string& path) {
    FileImage f;
    f.name_ = path;
    f.file_.emplace(path);
    f.bytes_ = f.file_->bytes();
    return f;
  }
  static FileImage from_bytes(std::string name, std::vector<uint8_t> bytes) {
    FileImage f;
    f.name_ = std::move(name);
    f.owned_ = std::move(bytes);
    f.bytes_ = std::span<const uint8_t>(f.owned_.data(), f.owned_.size());
    return f;
  }

  const std::string& name() const { return name_; }  // the path, as error messages show it
  std::span<const uint8_t> bytes() const { return bytes_; }
  // Whether the bytes are a file on disk (map()), so that offsets into bytes() are file offsets.
  bool on_disk() const { return file_.has_value(); }

 private:
  std::string name_;
  std::optional<MappedFile> file_;  // map(): the mapping
  std::vector<uint8_t> owned_;      // from_bytes(): the image
  std::span<const uint8_t> bytes_;  // from either
};

}  // namespace fdpp
