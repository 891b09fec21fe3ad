#include "core/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/tensor.h"
#include "fdpp/error.h"

namespace fdpp {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, std::span<const float> data) {
  check(Tensor::numel_of(shape) == static_cast<int64_t>(data.size()), "write_npy: shape {} does not match {} values",
        shape_string(shape), data.size());
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(3, 4)" but "(3,)"
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces and a newline to a
  // multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("{}: cannot write: {}", path, std::strerror(errno));
  const uint16_t header_len = static_cast<uint16_t>(header.size());
  const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header_len & 0xff),
                                      static_cast<unsigned char>(header_len >> 8)};
  bool ok = std::fwrite(preamble, 1, sizeof preamble, f) == sizeof preamble &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("{}: write failed: {}", path, std::strerror(err));
  }
}

}  // namespace fdpp
