// Helpers of the GPU kernel tests: device buffers, 16-bit conversions, output poisoning, and one
// comparison that reports NMSE (DESIGN.md's metric) plus the first elements that are out of
// tolerance, so that a failure says where and by how much.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/device_query.h"
#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/kernels.h"
#include "core/half.h"
#include "fdpp/error.h"
#include "test_util.h"

namespace fdpp::test {

using cuda::DType;

inline void cuda_ok(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// Waits for the default stream and turns an asynchronous kernel fault into a failure that names the
// kernel (rather than an error at some later, unrelated call).
inline void sync(const std::string& kernel) {
  cuda_ok(cudaGetLastError(), kernel + " (launch)");
  cuda_ok(cudaDeviceSynchronize(), kernel + " (execution)");
}

// f() throws an fdpp::Error whose message contains needle (a launcher's argument check).
template <class F>
void expect_error_naming(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an fdpp::Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

inline bool gpu_available() {
  static const bool available = [] {
    std::string why;
    const auto gpus = cuda::list_gpus(&why);
    if (gpus.empty()) {
      std::printf("[gpu tests] no usable CUDA GPU (%s): skipping\n", why.c_str());
      return false;
    }
    std::printf("[gpu tests] %s, sm_%d%d, %d SMs\n", gpus[0].name.c_str(), gpus[0].sm_major, gpus[0].sm_minor,
                gpus[0].multiprocessors);
    return true;
  }();
  return available;
}

// Every GPU test derives from this: skipped (not passed) without a GPU.
class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_available()) GTEST_SKIP() << "no usable CUDA GPU";
  }
};

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::runtime_error("DeviceBuffer::upload: size mismatch");
    if (n_ > 0) cuda_ok(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) cuda_ok(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }
  // All bytes 0xFF: NaN as fp16, bf16 and fp32; -1 as int32.
  void poison() {
    if (n_ > 0) cuda_ok(cudaMemset(p_, 0xFF, n_ * sizeof(T)), "cudaMemset");
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ---- 16-bit values -------------------------------------------------------------------------------

inline const char* name(DType t) { return t == DType::F16 ? "f16" : "bf16"; }

inline const char* epilogue_name(cuda::Epilogue e) {
  switch (e) {
    case cuda::Epilogue::Store: return "store";
    case cuda::Epilogue::StoreF32: return "store_f32";
    case cuda::Epilogue::AddF32: return "add_f32";
    case cuda::Epilogue::SwiGLU: return "swiglu";
  }
  return "?";
}

inline uint16_t to_bits(float v, DType t) { return t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v); }
inline float from_bits(uint16_t b, DType t) { return t == DType::F16 ? fp16_to_f32(b) : bf16_to_f32(b); }

inline std::vector<uint16_t> to_bits(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = to_bits(v[i], t);
  return b;
}
inline std::vector<float> from_bits(const std::vector<uint16_t>& b, DType t) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = from_bits(b[i], t);
  return v;
}

// Random normal values already rounded to the 16-bit type (so the CPU reference sees exactly what
// the kernel reads): returns the bits, and the values as floats in `values`.
inline std::vector<uint16_t> random_bits(size_t n, DType t, std::vector<float>& values, float scale = 1.f) {
  values = random_vector(n, scale);
  auto b = to_bits(values, t);
  values = from_bits(b, t);
  return b;
}

// Unit roundoff of the output type: the kernels' outputs are one rounding away from fp32.
inline double unit_roundoff(DType t) { return t == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }

// ---- comparison ----------------------------------------------------------------------------------

struct Tolerance {
  double nmse = 5e-4;  // DESIGN.md: fp16/bf16 kernels against the fp32 CPU reference
  double rtol = 0;     // per element: |out - ref| <= rtol * |ref| + atol * rms(ref); 0 = no element check
  double atol = 0;
};

// The usual tolerance of a 16-bit output that is one rounding of an fp32 value equal to the
// reference up to fp32 noise.
inline Tolerance rounding_tolerance(DType t) { return {5e-4, 4 * unit_roundoff(t), 2 * unit_roundoff(t)}; }

// Worst NMSE per kernel (the first word of `what`), printed after the run as "[NMSE] ..." lines so
// that a passing run still shows how close each kernel came to its bound.
inline std::map<std::string, std::pair<double, int>>& nmse_stats() {
  static std::map<std::string, std::pair<double, int>> stats;
  return stats;
}

class NmseReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [kernel, s] : nmse_stats())
      std::printf("[NMSE] %-28s worst %.3e over %d comparisons\n", kernel.c_str(), s.first, s.second);
  }
};

// Compares and records failures (EXPECT); returns the NMSE.
inline double expect_close(const std::vector<float>& out, const std::vector<float>& ref, const Tolerance& tol,
                           const std::string& what) {
  EXPECT_EQ(out.size(), ref.size()) << what;
  if (out.size() != ref.size()) return INFINITY;
  size_t non_finite = 0, first_non_finite = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i]) && std::isfinite(ref[i])) {
      if (non_finite++ == 0) first_non_finite = i;
    }
  }
  EXPECT_EQ(non_finite, 0u) << what << ": " << non_finite << " of " << out.size()
                            << " outputs are NaN/inf (unwritten or overflow); first at index " << first_non_finite
                            << " (ref " << ref[first_non_finite] << ")";
  if (non_finite > 0) return INFINITY;
  const double e = nmse(out, ref);
  EXPECT_LE(e, tol.nmse) << what << ": NMSE " << e;
  auto& stat = nmse_stats()[what.substr(0, what.find(' '))];
  stat.first = std::max(stat.first, e);
  ++stat.second;
  if (tol.rtol > 0 || tol.atol > 0) {
    double ss = 0;
    for (float r : ref) ss += double(r) * r;
    const double rms = ref.empty() ? 0 : std::sqrt(ss / ref.size());
    size_t bad = 0;
    std::ostringstream first;
    for (size_t i = 0; i < out.size(); ++i) {
      const double d = std::fabs(double(out[i]) - ref[i]);
      if (d > tol.rtol * std::fabs(ref[i]) + tol.atol * rms) {
        if (bad < 5) first << " [" << i << "] out " << out[i] << " ref " << ref[i] << ";";
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << out.size() << " elements out of tolerance (rtol "
                       << tol.rtol << ", atol " << tol.atol << " x rms " << rms << "):" << first.str();
  }
  return e;
}

// Random permutation of 0 .. n-1.
inline std::vector<int32_t> permutation(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = i;
  std::shuffle(p.begin(), p.end(), rng());
  return p;
}

inline int uniform_int(int lo, int hi) {  // [lo, hi]
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}

// ---- benchmarks (FDPP_GPU_BENCH=1; the Bench* tests skip otherwise) --------------------------

namespace bench {

inline bool enabled() {
  const char* e = std::getenv("FDPP_GPU_BENCH");
  return e != nullptr && std::string(e) == "1";
}

// Median time (us) of `reps` launches of f(rep), each timed by its own pair of events.
template <class F>
double median_us(int reps, F&& f) {
  for (int i = 0; i < 3; ++i) f(i);
  sync("bench warm-up");
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    cuda_ok(cudaEventRecord(ev[2 * i]), "cudaEventRecord");
    f(i);
    cuda_ok(cudaEventRecord(ev[2 * i + 1]), "cudaEventRecord");
  }
  sync("bench");
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]), "cudaEventElapsedTime");
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

constexpr double kReadBandwidth = 4.46e12;  // DESIGN.md: measured H200 streaming read

}  // namespace bench

}  // namespace fdpp::test
