#include "core/atomic_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fdpp/error.h"

namespace fdpp {

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    check(out.good(), "{}: cannot write {}", path, what);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out.good()) {
      fs::remove(tmp, ec);
      fail("{}: cannot write {}", path, what);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("{}: cannot write {} ({})", path, what, ec.message());
  }
}

}  // namespace fdpp
