// How residual_norm lays a row over its block, shared with the kernels that replay its sums
// (moe_route_one's folded norm) so that both give the same bits.
#pragma once

namespace fdpp::cuda::detail {

// Threads of residual_norm's block per row: one 8-element unit (or one element) per thread, in
// whole warps, up to 1024 threads; a thread sums its units c, c + threads, ... in order.
__host__ __device__ constexpr int row_threads(int units) {
  const int t = ((units + 31) / 32) * 32;
  return t < 32 ? 32 : t > 1024 ? 1024 : t;
}

}  // namespace fdpp::cuda::detail
