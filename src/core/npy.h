// Writes NumPy .npy files (format 1.0, little-endian float32, C order). The file is written to a
// temporary name and renamed into place, so a failed write never leaves a truncated file behind.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace fdpp {

void write_npy_f32(const std::string& path, const std::vector<int64_t>& shape, std::span<const float> data);

}  // namespace fdpp
