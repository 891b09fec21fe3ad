// Read-only memory map of a whole file (RAII). Model files are mapped, never read into buffers,
// so that loading a 13 GB checkpoint costs no copy and validation can look at sizes first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace fdpp {

class MappedFile {
 public:
  // Throws fdpp::Error naming the path when it is missing, not a regular file, or unreadable.
  // An empty file maps to an empty span (callers report it as "empty file").
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fdpp
