// FP8 e4m3 (the "FN" variant of the OCP 8-bit formats: sign, 4 exponent bits with bias 7, 3
// mantissa bits, no infinities, S.1111.111 is NaN, largest finite 448) <-> fp32 on the host. The
// CPU dequantizes FP8 checkpoints with these, and the CUDA tests' references quantize with them;
// both give the bits of CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) and
// __nv_cvt_fp8_to_halfraw (tests/gpu/test_fp8_checkpoint.cpp compares them over many values).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fdpp {

// The value of e4m3 bits: exact (every e4m3 value is an fp32 value). NaN for S.1111.111.
inline float fp8_e4m3_to_float(uint8_t bits) {
  const int e = (bits >> 3) & 0xF, m = bits & 7;
  float v;
  if (e == 0xF && m == 7)
    v = std::nanf("");
  else if (e == 0)
    v = std::ldexp(static_cast<float>(m), -9);  // subnormal: m x 2^-9
  else
    v = std::ldexp(static_cast<float>(8 + m), e - 10);  // (1 + m/8) x 2^(e-7)
  return (bits & 0x80) ? -v : v;
}

// e4m3 bits of v: round to nearest even, saturating to +-448 (never NaN for a finite v); NaN gives
// 0x7F; magnitudes up to 2^-10 give a (signed) zero.
inline uint8_t fp8_e4m3_from_float(float v) {
  uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  if (std::isnan(v)) return 0x7F;  // the canonical NaN, whatever the sign (as CUDA's)
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const float a = std::fabs(v);
  // 464 is halfway from 448 to the next step (480, which e4m3 lacks); it rounds to even, 448.
  if (a > 464.f) return sign | 0x7E;
  // The step of a's binade in e4m3 is 2^(exp - 3); below 2^-6 the subnormals share the step 2^-9
  // of the lowest normal binade. With m = a / step rounded to even (8 <= m <= 16 for normal a, a
  // carry to 16 being the next binade's first value), the code is ((exp + 7) << 3) + m - 8, which
  // also gives the subnormal codes m for exp = -6.
  const int exp = a < 0x1p-6f ? -6 : std::ilogb(a);
  const float m = std::nearbyint(std::ldexp(a, 3 - exp));  // exact scaling; rounds to even
  return static_cast<uint8_t>(sign | (((exp + 7) << 3) + static_cast<int>(m) - 8));
}

}  // namespace fdpp
