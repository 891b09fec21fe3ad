#include "core/read_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "fdpp/error.h"

namespace fdpp {

std::string read_all(std::istream& in, size_t max_bytes, std::string_view name) {
  std::string text;
  constexpr size_t kChunk = size_t{1} << 20;
  while (in) {
    // One byte beyond the bound tells "exactly max_bytes" from "more".
    const size_t want = std::min(kChunk, max_bytes + 1 - text.size());
    const size_t old = text.size();
    text.resize(old + want);
    in.read(text.data() + old, static_cast<std::streamsize>(want));
    text.resize(old + static_cast<size_t>(in.gcount()));
    check(text.size() <= max_bytes, "{}: longer than {} MiB (the most fdpp reads from it)", name, max_bytes >> 20);
  }
  check(!in.bad(), "{}: read error", name);
  return text;
}

std::string read_file(const std::string& path, size_t max_bytes, std::string_view what) {
  std::error_code ec;  // a path that cannot be examined is left to the open below to explain
  check(!std::filesystem::is_directory(path, ec), "{}: is a directory, not {}", path, what);
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open {} ({})", path, what, std::strerror(errno));
  return read_all(in, max_bytes, path);
}

}  // namespace fdpp
