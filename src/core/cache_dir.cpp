#include "core/cache_dir.h"

#include <cstdlib>

namespace fdpp {

std::string cache_dir() {
  if (const char* c = std::getenv("FDPP_CACHE"); c != nullptr && *c != '\0') return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return std::string(x) + "/fdpp";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.cache/fdpp";
  return ".cache/fdpp";
}

}  // namespace fdpp
