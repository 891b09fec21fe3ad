// A host tensor in fp32: the CPU backend's only storage type and the loaders' output. Row-major;
// a weight matrix is [out_features, in_features] (the layout of both GGUF and HF checkpoints).
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace fdpp {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s) : shape(std::move(s)), data(numel_of(shape)) {}

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int64_t dim(size_t i) const { return shape.at(i); }
  bool empty() const { return data.empty(); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  static int64_t numel_of(const std::vector<int64_t>& s) {
    return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
  }
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[576, 49152]"

}  // namespace fdpp
