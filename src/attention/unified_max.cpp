#include "attention/unified_max.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "fdpp/error.h"

namespace fdpp {

// Derivation of [a, b] for fp32 (the accumulators of the CUDA kernel are fp32; P = e^(x - phi) is
// kept in fp32 for the P.V product; an fp16 P would need its own, far narrower range).
//
// Let m be the row's max logit, N = max_context the most keys a row can have, and d = m - phi.
// Every term of the row satisfies x_j - phi <= d.
//
// (i, ii) No overflow. The largest term is e^d, the denominator is at most N e^d, and the
// numerator is at most N e^d max|v|. With |v| <= 2^16 (kUnifiedMaxValueHeadroomLog2: activations
// of real models stay far below) and one more nat of margin for the rounding of e^ and of the
// sums:
//     N e^b 2^16 <= FLT_MAX / e   <=>   b = ln(FLT_MAX) - ln N - 16 ln 2 - 1.
//   ln(FLT_MAX) = ln(3.4028e38) = 88.7228, 16 ln 2 = 11.0904.
//   N = 2^17 = 131072 (ln N = 11.7835): b = 88.7228 - 11.7835 - 11.0904 - 1 = 64.849;
//   e^b = 1.3e28, N e^b = 1.7e33 (denominator), times 2^16 = 1.1e38 < FLT_MAX = 3.4e38.
//   N = 8192 (ln N = 9.0109): b = 67.622. So b + ln N = 76.63 < 88.72 for every N.
//
// (iii) No lost answer. The softmax only needs the terms that are not negligible next to the
// largest: a term below e^d 2^-24 / N contributes at most 2^-24 / N of the row's mass, and all N of
// them together at most 2^-24, below fp32 rounding. So every term within 24 ln 2 + ln N of the max
// must be a normal float (the CUDA kernel's fast e^ flushes subnormals to zero):
//     e^a 2^-24 / N >= 2^-126 e   <=>   a = ln(2^-126) + 24 ln 2 + ln N + 1.
//   ln(2^-126) = -87.3365, 24 ln 2 = 16.6355.
//   N = 2^17: a = -87.3365 + 16.6355 + 11.7835 + 1 = -57.917; e^a = 7.0e-26 ~ 2^-83.6, a normal
//   float with 42 binades of headroom above FLT_MIN; the smallest relevant term e^a 2^-41
//   = 3.2e-38 > FLT_MIN = 1.18e-38.
//   N = 8192: a = -60.69 (fewer keys, so fewer negligible terms to worry about).
// The denominator then lies in [e^a, N e^b] = [7e-26, 1.7e33] and 1/den never overflows.
//
// The range is 122.8 nats wide at N = 2^17, while the row maxima of real models spread over a few
// tens of nats (calibration measures it), so one phi per layer leaves almost every row inside.
// fp32 relative precision does not depend on magnitude, so inside [a, b] the unified-max result
// equals the stable one to fp32 rounding: the only extra error is the rounding of x - phi, half
// an ulp of |x - phi| <= 65, i.e. 3.8e-6 absolute in the exponent, 3.8e-6 relative per term.
UnifiedMaxBounds derive_unified_max_bounds(float phi, int64_t max_context) {
  check(max_context >= 1, "unified max: max_context {} must be positive", max_context);
  check(std::isfinite(phi), "unified max: phi {} is not finite", phi);
  const double ln_n = std::log(static_cast<double>(max_context));
  const double ln2 = std::log(2.0);
  const double ln_flt_max = std::log(static_cast<double>(FLT_MAX));
  const double ln_flt_min = std::log(static_cast<double>(FLT_MIN));
  const double b = ln_flt_max - ln_n - kUnifiedMaxValueHeadroomLog2 * ln2 - 1.0;
  const double a = ln_flt_min + 24.0 * ln2 + ln_n + 1.0;
  check(a < b, "unified max: max_context {} leaves no safe range (a = {:.2f} >= b = {:.2f})", max_context, a, b);
  // Rounded inwards to fp32 so that the stored bounds are never wider than derived.
  UnifiedMaxBounds r;
  r.phi = phi;
  r.a = std::nextafter(static_cast<float>(a), INFINITY);
  r.b = std::nextafter(static_cast<float>(b), -INFINITY);
  return r;
}

}  // namespace fdpp
