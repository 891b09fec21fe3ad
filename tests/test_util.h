// Shared test helpers: the NMSE metric of DESIGN.md, random inputs, fixture paths, a .npy reader.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <unistd.h>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/half.h"
#include "fdpp/error.h"

namespace fdpp::test {

// NMSE = sum((out - ref)^2) / sum(ref^2); infinity when out has a NaN/inf (NaN never passes).
inline double nmse(std::span<const float> out, std::span<const double> ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

inline double nmse(std::span<const float> out, std::span<const float> ref) {
  std::vector<double> r(ref.begin(), ref.end());
  return nmse(out, r);
}

// The message of the fdpp::Error that f throws. Every fdpp error is one line: a message with a
// newline, or no error at all, fails the calling test.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no error";
  return "";
}

// stmt throws an fdpp::Error of one line that contains fragment.
#define EXPECT_ERROR(stmt, fragment)                                                               \
  do {                                                                                             \
    const std::string msg_ = ::fdpp::test::error_of([&] { stmt; });                                \
    EXPECT_NE(msg_.find(fragment), std::string::npos) << "error was: '" << msg_ << "'";            \
  } while (0)

// The scratch directories this process made, removed when it exits normally (a crash leaves them
// for inspection).
struct ScratchDirs {
  std::vector<std::filesystem::path> dirs;
  ~ScratchDirs() {
    for (const auto& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};
inline ScratchDirs& scratch_dirs() {
  static ScratchDirs s;
  return s;
}

// An empty directory under the system's temp dir, unique to this process and name.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / fmt::format("fdpp_test_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  auto& made = scratch_dirs().dirs;
  if (std::find(made.begin(), made.end(), d) == made.end()) made.push_back(d);
  return d;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// Fresh random inputs each run; the seed is printed so a failure can be replayed with FDPP_TEST_SEED.
inline std::mt19937_64& rng() {
  static std::mt19937_64 engine = [] {
    uint64_t seed = std::random_device{}();
    if (const char* s = std::getenv("FDPP_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
    std::printf("[test seed %llu]\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return engine;
}

inline std::vector<float> random_vector(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng());
  return v;
}

// The tests/ folder: compiled in, or $FDPP_TEST_DIR_OVERRIDE when the binary runs from another
// checkout (the GPU machine runs binaries built here).
inline std::string test_dir() {
  if (const char* o = std::getenv("FDPP_TEST_DIR_OVERRIDE"); o != nullptr && *o != '\0') return o;
  return FDPP_TEST_DIR;
}

inline std::string fixture(const std::string& relative) { return test_dir() + "/fixtures/" + relative; }

// The default model, or empty when it has not been fetched (tests then skip).
inline std::string default_model_or_empty() {
  std::string cache;
  if (const char* c = std::getenv("FDPP_CACHE")) cache = c;
  else if (const char* x = std::getenv("XDG_CACHE_HOME")) cache = std::string(x) + "/fdpp";
  else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/fdpp";
  std::string path = cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::ifstream f(path);
  return f.good() ? path : std::string();
}

// Minimal .npy reader for fixtures: little-endian <f4 or <f2, C order, any rank.
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

inline NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not npy");
  const int major = bytes[6];
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    offset = 10;
  } else {
    uint32_t l;
    std::memcpy(&l, &bytes[8], 4);
    header_len = l;
    offset = 12;
  }
  const std::string header(bytes.data() + offset, header_len);
  const bool f16 = header.find("'<f2'") != std::string::npos;
  if (!f16 && header.find("'<f4'") == std::string::npos) throw std::runtime_error(path + ": dtype not f2/f4");
  if (header.find("'fortran_order': False") == std::string::npos) throw std::runtime_error(path + ": fortran order");
  NpyArray a;
  const size_t open = header.find('(', header.find("'shape'")), close = header.find(')', open);
  std::string dims = header.substr(open + 1, close - open - 1);
  for (size_t p = 0; p < dims.size();) {
    size_t q = dims.find(',', p);
    if (q == std::string::npos) q = dims.size();
    std::string item = dims.substr(p, q - p);
    if (item.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(item));
    p = q + 1;
  }
  int64_t n = 1;
  for (auto d : a.shape) n *= d;
  const char* data = bytes.data() + offset + header_len;
  if (bytes.size() - offset - header_len != static_cast<size_t>(n) * (f16 ? 2 : 4))
    throw std::runtime_error(path + ": size mismatch");
  a.data.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (f16) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      a.data[i] = fp16_to_f32(h);
    } else {
      std::memcpy(&a.data[i], data + 4 * i, 4);
    }
  }
  return a;
}

}  // namespace fdpp::test
