// Sampling on the GPU with the CPU Sampler's exact filter semantics (src/engine/sampler.cpp):
// repetition penalty, then greedy argmax or temperature -> top-k -> softmax -> top-p -> min-p ->
// one draw, ties always broken by the lower token id.
//
// Kernels (one block per row):
//   bias         logit_bias and the min_tokens mask (LogitAdjust's CSR lists): one thread walks the
//                row's entries in order, as the CPU does (an id may be biased and then masked).
//   counts       presence / frequency penalties over the row's generated tokens: counts in the
//                workspace (zeroed for the ids present, atomicAdd, then the first entry to CAS a
//                count to its negative applies it once), in float with no contraction, as the CPU.
//   logprobs     after the draw, over the raw logits: log-sum-exp in double, the sampled token's
//                logprob and rank, the top k by k block argmax passes; writes 2 + 2k floats a row.
//   penalty      each distinct history token once: every history entry i writes its index into
//                mark[id] (any writer wins), then after a barrier only the entry whose index is
//                stored applies the penalty. No sort, no O(n^2) scan; mark is workspace.
//   argmax       greedy: max logit, lowest index on ties (std::max_element's first maximum).
//   topk_sample  1 <= top_k <= 1024 (the usual case: llama.cpp's default is 40). Fast path: row
//                max, then counts of keys >= max - delta for delta = 0.5 .. 64; the smallest delta
//                admitting >= k keys gives a candidate set holding the whole top k (ties included);
//                when it fits in shared memory (4096) it is gathered, bitonic-sorted by (key desc,
//                id asc) and its first k finish in the same block: 3 passes over the row. Otherwise
//                (very flat rows) an exact radix select of the k-th largest key (4 passes of 8-bit
//                histograms), a gather of the k candidates (lowest-id ties at the threshold), the
//                same sort. Needs no workspace.
//   full sort    top_k off or > 1024: cub::DeviceSegmentedRadixSort::SortPairsDescending of
//                (logit / temperature, id) over all rows (cub::DeviceRadixSort for a single row;
//                stable, ids enter ascending, so ties keep the lower id first), then the same
//                finishing code over the sorted rows. Costs the
//                workspace (16 bytes per logit) and a full sort; a mass-based radix select could
//                avoid it for top-p-only requests later.
// The finishing code (finalize_draw) walks the sorted candidates with block-wide reductions and
// chunked block scans in double, mirroring the CPU: probs = float(exp(key - max) / sum), top-p keeps
// the smallest prefix whose (double) cumulative mass is >= p and renormalizes, min-p keeps
// probs >= min_p * prob[0] and renormalizes, then the first candidate whose cumulative prob exceeds
// u wins (the last one if rounding leaves u above the total).
// Random numbers: a stateless Philox4x32-10 (Salmon et al., SC'11, as in Random123/cuRAND), key =
// seed, counter = (offsets[r], 0): two 32-bit outputs make one 53-bit double in [0, 1), the same
// resolution as the CPU sampler's. The same (seed, offset) always gives the same u.
// NaN logits are treated as -inf (the CPU sampler throws; a kernel cannot).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda/functional>

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::cuda_check;

constexpr int kTopKMax = 1024;       // top_k up to this runs the select-and-sort-in-shared-memory path
constexpr int kCandMax = 4096;       // candidates the fast path of that kernel sorts in shared memory
constexpr int kBlock = 512;          // threads of the select / finalize kernels (1024 would cap them at
                                     // 64 registers and spill)
constexpr int kArgmaxThreads = 1024;
constexpr int kPenaltyThreads = 256;
constexpr int kPrepThreads = 256;
constexpr size_t kAlign = 256;

// ---- random numbers ----------------------------------------------------------------------------

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    const uint32_t lo0 = 0xD2511F53u * c.x, hi0 = __umulhi(0xD2511F53u, c.x);
    const uint32_t lo1 = 0xCD9E8D57u * c.z, hi1 = __umulhi(0xCD9E8D57u, c.z);
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

__device__ __forceinline__ double uniform01(uint64_t seed, uint64_t offset) {
  const uint4 r = philox4x32_10(make_uint4(static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u),
                                make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)));
  const uint64_t bits = (static_cast<uint64_t>(r.x >> 5) << 26) | (r.y >> 6);  // 27 + 26 = 53 bits
  return static_cast<double>(bits) * 0x1.0p-53;
}

// ---- keys ----------------------------------------------------------------------------------------

// The value the CPU sorts by: logit / temperature (a true division, as the CPU does). NaN -> -inf;
// -0 -> +0 so that it ties with +0 (the float comparison the CPU uses calls them equal).
__device__ __forceinline__ float sample_key(float logit, float temperature) {
  float k = logit / temperature;
  if (isnan(k)) k = -INFINITY;
  if (k == 0.f) k = 0.f;
  return k;
}

// Order-preserving map float -> uint32 (larger float <-> larger uint), and back.
__device__ __forceinline__ uint32_t order_bits(float k) {
  const uint32_t b = __float_as_uint(k);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_order_bits(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// Candidate packed for one 64-bit descending sort: key bits high, (0xffffffff - id) low, so equal
// keys order by ascending id. Real candidates are > 0 (order_bits(-inf) = 0x007fffff); 0 pads.
__device__ __forceinline__ unsigned long long pack(uint32_t u, int id) {
  return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ float packed_key(unsigned long long c) {
  return from_order_bits(static_cast<uint32_t>(c >> 32));
}
__device__ __forceinline__ int packed_id(unsigned long long c) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(c));
}

// ---- block-wide helpers ------------------------------------------------------------------------

template <int NT>
struct BlockOps {
  using ReduceD = cub::BlockReduce<double, NT>;
  using ScanD = cub::BlockScan<double, NT>;
  using ReduceI = cub::BlockReduce<int, NT>;
  using ScanI = cub::BlockScan<int, NT>;
  struct Shared {
    union {
      typename ReduceD::TempStorage reduce_d;
      typename ScanD::TempStorage scan_d;
      typename ReduceI::TempStorage reduce_i;
      typename ScanI::TempStorage scan_i;
    } temp;
    double d;
    int i;
  };

  // sum_{i < n} f(i) in double; every thread gets it.
  template <class F>
  static __device__ double sum(Shared& sh, int n, F f) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += NT) acc += f(i);
    __syncthreads();  // sh is free (previous users are past this barrier)
    const double total = ReduceD(sh.temp.reduce_d).Sum(acc);
    if (threadIdx.x == 0) sh.d = total;
    __syncthreads();
    return sh.d;
  }

  // Smallest i < n with pred(i), or n. Each thread stops at its first hit, so a predicate that holds
  // from some index on costs only up to that index.
  template <class P>
  static __device__ int first(Shared& sh, int n, P pred) {
    int best = n;
    for (int i = threadIdx.x; i < n; i += NT) {
      if (pred(i)) {
        best = i;
        break;
      }
    }
    __syncthreads();
    const int m = ReduceI(sh.temp.reduce_i).Reduce(best, ::cuda::minimum<>{});
    if (threadIdx.x == 0) sh.i = m;
    __syncthreads();
    return sh.i;
  }

  // Smallest i < n whose inclusive prefix sum cum_i = sum_{j <= i} f(j) (double, index order)
  // satisfies pred(cum_i), or n. Chunks of NT with a running carry; stops at the chunk with a hit.
  template <class F, class P>
  static __device__ int first_cum(Shared& sh, int n, F f, P pred) {
    double carry = 0.0;
    for (int base = 0; base < n; base += NT) {
      const int i = base + static_cast<int>(threadIdx.x);
      const double v = i < n ? f(i) : 0.0;
      double incl, chunk_total;
      __syncthreads();
      ScanD(sh.temp.scan_d).InclusiveSum(v, incl, chunk_total);
      const int hit = (i < n && pred(carry + incl)) ? i : INT_MAX;
      __syncthreads();
      const int m = ReduceI(sh.temp.reduce_i).Reduce(hit, ::cuda::minimum<>{});
      if (threadIdx.x == 0) sh.i = m;
      __syncthreads();
      const int found = sh.i;
      if (found != INT_MAX) return found;
      carry += chunk_total;
    }
    return n;
  }
};

// The CPU Sampler's softmax -> top-p -> min-p -> draw over n >= 1 candidates sorted by (key desc,
// id asc); key(i), id(i) read them. Writes the chosen id to *out (thread 0).
template <int NT, class KeyF, class IdF>
__device__ void finalize_draw(typename BlockOps<NT>::Shared& sh, int n, KeyF key, IdF id, float top_p, float min_p,
                              double u, int32_t* out) {
  using Ops = BlockOps<NT>;
  const float max_key = key(0);
  // exp(key - max) as the CPU computes it (float); key == max gives exactly 1 and also covers the
  // all -inf and +inf rows (no inf - inf).
  auto e = [&](int i) -> float {
    const float k = key(i);
    return k == max_key ? 1.f : expf(k - max_key);
  };
  const double sum0 = Ops::sum(sh, n, [&](int i) { return static_cast<double>(e(i)); });
  auto p0 = [&](int i) -> float { return static_cast<float>(static_cast<double>(e(i)) / sum0); };

  // top-p: smallest prefix whose cumulative mass reaches p (at least one), renormalized.
  const bool do_top_p = top_p < 1.f;
  int n1 = n;
  double sum1 = 1.0;
  if (do_top_p) {
    const double target = top_p;
    const int f = Ops::first_cum(
        sh, n, [&](int i) { return static_cast<double>(p0(i)); }, [&](double cum) { return cum >= target; });
    n1 = f < n ? f + 1 : n;
    sum1 = Ops::sum(sh, n1, [&](int i) { return static_cast<double>(p0(i)); });
  }
  auto p1 = [&](int i) -> float {
    const float p = p0(i);
    return do_top_p ? static_cast<float>(static_cast<double>(p) / sum1) : p;
  };

  // min-p: keep the prefix with prob >= min_p * prob[0] (at least one), renormalized.
  const bool do_min_p = min_p > 0.f;
  int n2 = n1;
  double sum2 = 1.0;
  if (do_min_p) {
    const float threshold = min_p * p1(0);
    n2 = Ops::first(sh, n1, [&](int i) { return i >= 1 && !(p1(i) >= threshold); });
    sum2 = Ops::sum(sh, n2, [&](int i) { return static_cast<double>(p1(i)); });
  }
  auto p2 = [&](int i) -> float {
    const float p = p1(i);
    return do_min_p ? static_cast<float>(static_cast<double>(p) / sum2) : p;
  };

  // Draw: the first candidate whose cumulative probability exceeds u.
  const int f = Ops::first_cum(
      sh, n2, [&](int i) { return static_cast<double>(p2(i)); }, [&](double cum) { return u < cum; });
  const int pick = f < n2 ? f : n2 - 1;
  if (threadIdx.x == 0) *out = id(pick);
}

// ---- kernels -----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kPenaltyThreads)
    penalty_kernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ history,
                   const int32_t* __restrict__ history_lens, int history_stride, float penalty, int* __restrict__ mark) {
  const int r = blockIdx.x;
  const int32_t* h = history + int64_t(r) * history_stride;
  int n = history_lens[r];
  n = n < 0 ? 0 : (n > history_stride ? history_stride : n);
  int* mk = mark + int64_t(r) * vocab;
  float* lg = logits + int64_t(r) * vocab;
  for (int i = threadIdx.x; i < n; i += kPenaltyThreads) {
    const int id = h[i];
    if (id >= 0 && id < vocab) mk[id] = i;
  }
  __syncthreads();  // block-wide visibility of the global writes above
  for (int i = threadIdx.x; i < n; i += kPenaltyThreads) {
    const int id = h[i];
    if (id >= 0 && id < vocab && mk[id] == i) {
      const float l = lg[id];
      lg[id] = l > 0.f ? l / penalty : l * penalty;  // HF RepetitionPenaltyLogitsProcessor
    }
  }
}

__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ logits, int vocab,
                                                        int32_t* __restrict__ out_ids) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const int r = blockIdx.x;
  const float* lg = logits + int64_t(r) * vocab;
  float bv = -INFINITY;
  int bi = INT_MAX;
#pragma unroll 8
  for (int i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
    float v = lg[i];
    if (isnan(v)) continue;
    if (argmax_better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (argmax_better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    bv = sv[lane];
    bi = si[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (argmax_better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) out_ids[r] = bi == INT_MAX ? 0 : bi;  // all NaN: token 0
  }
}


// ---- logit adjustments and log probabilities -----------------------------------------------------

__global__ void bias_kernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ offsets,
                            const int32_t* __restrict__ ids, const float* __restrict__ values) {
  if (threadIdx.x != 0) return;
  const int r = blockIdx.x;
  float* lg = logits + int64_t(r) * vocab;
  for (int i = offsets[r]; i < offsets[r + 1]; ++i) {
    const int id = ids[i];
    if (id < 0 || id >= vocab) continue;
    const float v = values[i];
    lg[id] = v == -INFINITY ? -INFINITY : lg[id] + v;
  }
}

__global__ void __launch_bounds__(kPenaltyThreads)
    count_penalty_kernel(float* __restrict__ logits, int vocab, const int32_t* __restrict__ offsets,
                         const int32_t* __restrict__ ids, const float* __restrict__ presence,
                         const float* __restrict__ frequency, int* __restrict__ counts) {
  const int r = blockIdx.x;
  const int begin = offsets[r], end = offsets[r + 1];
  const float pres = presence[r], freq = frequency[r];
  if (begin >= end || (pres == 0.f && freq == 0.f)) return;
  int* c = counts + int64_t(r) * vocab;
  float* lg = logits + int64_t(r) * vocab;
  for (int i = begin + threadIdx.x; i < end; i += kPenaltyThreads) {
    const int id = ids[i];
    if (id >= 0 && id < vocab) c[id] = 0;
  }
  __syncthreads();
  for (int i = begin + threadIdx.x; i < end; i += kPenaltyThreads) {
    const int id = ids[i];
    if (id >= 0 && id < vocab) atomicAdd(&c[id], 1);
  }
  __syncthreads();
  for (int i = begin + threadIdx.x; i < end; i += kPenaltyThreads) {
    const int id = ids[i];
    if (id < 0 || id >= vocab) continue;
    const int k = c[id];
    // The first entry to flip the count applies the penalty once; the CPU's expression with the
    // same explicit fused multiply-add (one rounding on both).
    if (k > 0 && atomicCAS(&c[id], k, -k) == k) lg[id] = __fsub_rn(lg[id], __fmaf_rn(static_cast<float>(k), freq, pres));
  }
}

__device__ __forceinline__ float valid_logit(float l) { return isnan(l) ? -INFINITY : l; }

__global__ void __launch_bounds__(kBlock)
    logprobs_kernel(const float* __restrict__ logits, int vocab, const int32_t* __restrict__ rows,
                    const int32_t* __restrict__ tokens, int k, float* __restrict__ out, int out_stride) {
  using Ops = BlockOps<kBlock>;
  using ReduceKey = cub::BlockReduce<unsigned long long, kBlock>;
  __shared__ typename Ops::Shared sh;
  __shared__ typename ReduceKey::TempStorage reduce_key;
  __shared__ unsigned long long best;
  const int j = blockIdx.x, tid = threadIdx.x;
  const int row = rows[j];
  const float* lg = logits + int64_t(row) * vocab;
  const int token = tokens[row];
  float* o = out + int64_t(j) * out_stride;
  // Keys in the order (value desc, id asc) as one descending 64-bit integer (pack); every key is
  // below ~0ull, so the walk starts there. NaN counts as -inf, as in the CPU Sampler::logprobs.
  auto key = [&](int i) { return pack(order_bits(valid_logit(lg[i])), i); };
  auto next_below = [&](unsigned long long bound) {
    unsigned long long m = 0ull;
    for (int i = tid; i < vocab; i += kBlock) {
      const unsigned long long c = key(i);
      if (c < bound && c > m) m = c;
    }
    __syncthreads();  // `best` of the previous pass is read
    m = ReduceKey(reduce_key).Reduce(m, ::cuda::maximum<>{});
    if (tid == 0) best = m;
    __syncthreads();
    return best;
  };
  const unsigned long long first = next_below(~0ull);
  const float max_v = packed_key(first);
  const double sum = Ops::sum(sh, vocab, [&](int i) {
    const float v = valid_logit(lg[i]);
    return v == max_v ? 1.0 : exp(static_cast<double>(v) - static_cast<double>(max_v));
  });
  const double lse = static_cast<double>(max_v) + log(sum);
  const float t = valid_logit(lg[token]);
  const double greater = Ops::sum(sh, vocab, [&](int i) { return valid_logit(lg[i]) > t ? 1.0 : 0.0; });
  if (tid == 0) {
    o[0] = static_cast<float>(static_cast<double>(t) - lse);
    o[1] = static_cast<float>(greater + 1.0);
  }
  unsigned long long c = first;
  for (int e = 0; e < k && e < vocab; ++e) {
    if (e > 0) c = next_below(c);
    if (tid == 0) {
      o[2 + 2 * e] = static_cast<float>(packed_id(c));
      o[3 + 2 * e] = static_cast<float>(static_cast<double>(packed_key(c)) - lse);
    }
  }
}

// Radix select of the k-th largest key over the whole row (the fallback of topk_sample_kernel):
// 4 passes of 8-bit histograms, most significant byte first, then a gather of the k candidates
// into cand[0, k) (unsorted). Exact for any data, ties included.
__device__ void radix_select_topk(const float* lg, int vocab, int k, float temperature, unsigned long long* cand,
                                  typename BlockOps<kBlock>::Shared& sh, unsigned* hist) {
  using Ops = BlockOps<kBlock>;
  __shared__ unsigned sel_digit, sel_above, sel_count;
  __shared__ int n_taken;
  const int tid = threadIdx.x, lane = tid & 31;
  // After the 4 passes `prefix` is the exact order bits of the k-th largest key, `need` how many
  // keys equal to it belong to the top k, `eq_count` how many keys equal it in the row.
  uint32_t prefix = 0, prefix_mask = 0;
  int need = k;
  unsigned eq_count = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kBlock) hist[i] = 0;
    __syncthreads();
    // Block-uniform trip count so that the whole warp takes part in __match_any_sync (warp-aggregated
    // atomics: a row of equal logits would otherwise serialize on one counter).
    for (int base = 0; base < vocab; base += kBlock) {
      const int i = base + tid;
      unsigned bucket = 256;  // 256: not counted
      if (i < vocab) {
        const uint32_t u = order_bits(sample_key(lg[i], temperature));
        if ((u & prefix_mask) == prefix) bucket = (u >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, bucket);
      if (bucket != 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], static_cast<unsigned>(__popc(peers)));
    }
    __syncthreads();
    if (tid < 32) {
      // Lane L owns buckets 255 - 8L down to 248 - 8L (descending key order).
      unsigned c[8], total = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = hist[255 - 8 * lane - e];
        total += c[e];
      }
      unsigned incl = total;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned t = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += t;
      }
      const unsigned above = incl - total;
      if (above < static_cast<unsigned>(need) && static_cast<unsigned>(need) <= incl) {
        unsigned acc = above;
        for (int e = 0; e < 8; ++e) {
          if (acc + c[e] >= static_cast<unsigned>(need)) {
            sel_digit = 255u - 8u * lane - e;
            sel_above = acc;
            sel_count = c[e];
            break;
          }
          acc += c[e];
        }
      }
    }
    __syncthreads();
    prefix |= sel_digit << shift;
    prefix_mask |= 255u << shift;
    need -= static_cast<int>(sel_above);
    eq_count = sel_count;
  }
  const uint32_t threshold = prefix;
  const int n_above = k - need;  // keys strictly above the threshold, all kept

  if (tid == 0) n_taken = 0;
  __syncthreads();
  const bool all_ties = eq_count == static_cast<unsigned>(need);
  for (int i = tid; i < vocab; i += kBlock) {
    const uint32_t u = order_bits(sample_key(lg[i], temperature));
    if (u > threshold || (all_ties && u == threshold)) {
      const int pos = atomicAdd(&n_taken, 1);
      if (pos < k) cand[pos] = pack(u, i);
    }
  }
  if (!all_ties) {
    // Only the `need` lowest ids among the keys equal to the threshold: each thread counts the ties
    // in its own contiguous slice, an exclusive scan gives each slice its first rank.
    const int slice = (vocab + kBlock - 1) / kBlock;
    const int lo = min(tid * slice, vocab), hi = min(lo + slice, vocab);
    int count = 0;
    for (int i = lo; i < hi; ++i) count += order_bits(sample_key(lg[i], temperature)) == threshold;
    int rank;
    __syncthreads();
    typename Ops::ScanI(sh.temp.scan_i).ExclusiveSum(count, rank);
    for (int i = lo; i < hi && rank < need; ++i) {
      if (order_bits(sample_key(lg[i], temperature)) == threshold) cand[n_above + rank++] = pack(threshold, i);
    }
  }
  __syncthreads();
}

// Bitonic sort of cand[0, n) descending (n a power of two, at most kCandMax).
__device__ void bitonic_sort_desc(unsigned long long* cand, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += kBlock) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long x = cand[i], y = cand[j];
          const bool descending = (i & size) == 0;
          if (descending ? (x < y) : (x > y)) {
            cand[i] = y;
            cand[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Threshold offsets (in key units: multiplied by the temperature) below the row max tried by the
// fast path.
__constant__ float kDeltas[8] = {0.5f, 1.f, 2.f, 4.f, 8.f, 16.f, 32.f, 64.f};

__global__ void __launch_bounds__(kBlock)
    topk_sample_kernel(const float* __restrict__ logits, int vocab, int k, float temperature, float top_p,
                       float min_p, uint64_t seed, const uint64_t* __restrict__ seeds, const uint64_t* __restrict__ offsets,
                       int32_t* __restrict__ out_ids) {
  using Ops = BlockOps<kBlock>;
  __shared__ typename Ops::Shared sh;
  __shared__ unsigned long long cand[kCandMax];
  __shared__ unsigned hist[256];  // radix histogram; the fast path's reductions use its first words
  static_assert(16 * (kBlock / 32) <= 256, "hist reuse");
  __shared__ float row_max;
  __shared__ int n_taken, fast_count;
  __shared__ float fast_threshold;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kBlock / 32;
  const int r = blockIdx.x;
  const float* lg = logits + int64_t(r) * vocab;

  // Fast path: the top k are among the logits >= max - delta * temperature for the smallest delta
  // that admits at least k of them; when that set fits in shared memory (or the whole row does),
  // gather it with one warp-aggregated counter, sort it by the exact keys, take its first k. Three
  // plain passes over the row, compares on the raw logits (a division per element made the passes
  // ALU-bound on the row's single SM), instead of the radix select's five passes with histogram
  // atomics (~350 us for one 128K row).
  // Exact: with theta = max - delta * T and theta' a relative 1e-5 above it, every logit >= theta'
  // has a key fl(l / T) strictly above the key of any logit < theta (1e-5 >> the 6e-8 rounding),
  // so if at least k logits are >= theta', the k-th largest key beats everything outside
  // {l >= theta}: the set holds the whole top k, ties included. Not taken when the max is not
  // finite or so large that l / T could overflow.
  // (The row loops are unrolled so that each thread has several loads in flight.)
  float mx = -INFINITY;
#pragma unroll 8
  for (int i = tid; i < vocab; i += kBlock) mx = fmaxf(mx, lg[i]);  // fmaxf ignores NaN
  mx = detail::warp_max(mx);
  float* wred = reinterpret_cast<float*>(hist);  // [kWarps] then [16][kWarps] ints
  if (lane == 0) wred[warp] = mx;
  __syncthreads();
  if (warp == 0) {
    float v = lane < kWarps ? wred[lane] : -INFINITY;
    v = detail::warp_max(v);
    if (lane == 0) row_max = v;
  }
  __syncthreads();
  mx = row_max;
  const bool usable = fabsf(mx) < 1e30f && fabsf(mx) * 1e-8f < temperature;  // finite, l / T cannot overflow
  float theta[8], theta_hi[8];
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    theta[t] = mx - kDeltas[t] * temperature;
    theta_hi[t] = theta[t] + fmaxf(fabsf(theta[t]), 1e-30f) * 1e-5f;
  }
  int counts[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (vocab > kCandMax && usable) {
#pragma unroll 4
    for (int i = tid; i < vocab; i += kBlock) {
      const float l = lg[i];
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        counts[t] += l >= theta[t];
        counts[8 + t] += l >= theta_hi[t];
      }
    }
  }
  int* wcount = reinterpret_cast<int*>(hist);
  __syncthreads();  // row_max / wred readers are done with hist
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    int c = counts[t];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if (lane == 0) wcount[t * kWarps + warp] = c;
  }
  __syncthreads();
  if (tid == 0) {
    fast_count = -1;
    if (vocab <= kCandMax) {
      fast_count = vocab;
      fast_threshold = -INFINITY;  // everything (NaN too: gathered by the flag below)
    } else if (usable) {
      for (int t = 0; t < 8; ++t) {
        int n_lo = 0, n_hi = 0;
        for (int w = 0; w < kWarps; ++w) {
          n_lo += wcount[t * kWarps + w];
          n_hi += wcount[(8 + t) * kWarps + w];
        }
        if (n_hi >= k) {
          // (theta' / T must round strictly above theta / T for the argument above; it does
          // unless theta is ~0 and T huge: then the radix select runs.)
          if (n_lo <= kCandMax && theta_hi[t] / temperature > theta[t] / temperature) {
            fast_count = n_lo;
            fast_threshold = theta[t];
          }
          break;
        }
      }
    }
    n_taken = 0;
  }
  __syncthreads();

  int n_sorted;
  if (fast_count >= 0) {
    const float threshold = fast_threshold;
    const bool take_all = vocab <= kCandMax;
#pragma unroll 4
    for (int base = 0; base < vocab; base += kBlock) {
      const int i = base + tid;
      float l = 0.f;
      bool take = false;
      if (i < vocab) {
        l = lg[i];
        take = take_all || l >= threshold;
      }
      const unsigned mask = __ballot_sync(0xffffffffu, take);
      int wbase = 0;
      if (lane == 0 && mask != 0) wbase = atomicAdd(&n_taken, __popc(mask));
      wbase = __shfl_sync(0xffffffffu, wbase, 0);
      if (take) {
        const int pos = wbase + __popc(mask & ((1u << lane) - 1u));
        if (pos < kCandMax) cand[pos] = pack(order_bits(sample_key(l, temperature)), i);
      }
    }
    __syncthreads();
    n_sorted = min(n_taken, kCandMax);  // == fast_count
  } else {
    radix_select_topk(lg, vocab, k, temperature, cand, sh, hist);
    n_sorted = k;
  }
  int n_pow2 = 1;
  while (n_pow2 < n_sorted) n_pow2 <<= 1;
  for (int i = n_sorted + tid; i < n_pow2; i += kBlock) cand[i] = 0ull;
  __syncthreads();
  bitonic_sort_desc(cand, n_pow2);

  finalize_draw<kBlock>(
      sh, k, [&](int i) { return packed_key(cand[i]); }, [&](int i) { return packed_id(cand[i]); }, top_p, min_p,
      uniform01(seeds != nullptr ? seeds[r] : seed, offsets[r]), out_ids + r);
}

__global__ void __launch_bounds__(kPrepThreads)
    sort_prep_kernel(const float* __restrict__ logits, int rows, int vocab, float temperature, float* __restrict__ keys,
                     int* __restrict__ ids, int* __restrict__ segments) {
  const int r = blockIdx.x;
  const int64_t base = int64_t(r) * vocab;
  for (int i = threadIdx.x; i < vocab; i += kPrepThreads) {
    keys[base + i] = sample_key(logits[base + i], temperature);
    ids[base + i] = i;
  }
  if (threadIdx.x == 0) {
    segments[r] = static_cast<int>(base);
    if (r == rows - 1) segments[rows] = static_cast<int>(base + vocab);
  }
}

__global__ void __launch_bounds__(kBlock)
    sorted_sample_kernel(const float* __restrict__ keys, const int* __restrict__ ids, int vocab, int n, float top_p,
                         float min_p, uint64_t seed, const uint64_t* __restrict__ seeds, const uint64_t* __restrict__ offsets,
                       int32_t* __restrict__ out_ids) {
  using Ops = BlockOps<kBlock>;
  __shared__ typename Ops::Shared sh;
  const int r = blockIdx.x;
  const float* kr = keys + int64_t(r) * vocab;
  const int* ir = ids + int64_t(r) * vocab;
  finalize_draw<kBlock>(
      sh, n, [&](int i) { return kr[i]; }, [&](int i) { return ir[i]; }, top_p, min_p, uniform01(seeds != nullptr ? seeds[r] : seed, offsets[r]),
      out_ids + r);
}

// ---- workspace -----------------------------------------------------------------------------------

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Workspace regions (offsets from the 256-aligned base). `mark` (the penalty's scratch) aliases
// ids0: the penalty runs before the sort's inputs are written.
struct Layout {
  size_t keys0 = 0, keys1 = 0, ids0 = 0, ids1 = 0, segments = 0, cub = 0, cub_bytes = 0, total = 0;
};

// One row is sorted with the device-wide radix sort (the whole GPU on one row: the segmented sort
// runs one block per segment, 860 us for a 128K row on the H200); several rows with the segmented
// sort. Both are stable.
// The storage is sized for both, so that a workspace sized for `rows` also serves every call with
// fewer rows (a runner sizes it once for its largest batch).
size_t cub_sort_bytes(int rows, int vocab) {
  size_t single = 0, segmented = 0;
  cub::DoubleBuffer<float> keys(nullptr, nullptr);
  cub::DoubleBuffer<int> ids(nullptr, nullptr);
  cuda_check(cub::DeviceRadixSort::SortPairsDescending(nullptr, single, keys, ids, vocab, 0, 32),
             "cub::DeviceRadixSort::SortPairsDescending (workspace query)");
  const int* segments = nullptr;
  cuda_check(cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, segmented, keys, ids, rows * vocab, rows,
                                                                 segments, segments, 0, 32),
             "cub::DeviceSegmentedRadixSort::SortPairsDescending (workspace query)");
  return single > segmented ? single : segmented;
}

Layout make_layout(int rows, int vocab, bool with_sort) {
  Layout l;
  const size_t n = size_t(rows) * size_t(vocab);
  size_t at = 0;
  l.ids0 = at;  // always present: the penalty's mark array
  at += align_up(n * sizeof(int));
  if (with_sort) {
    l.ids1 = at;
    at += align_up(n * sizeof(int));
    l.keys0 = at;
    at += align_up(n * sizeof(float));
    l.keys1 = at;
    at += align_up(n * sizeof(float));
    l.segments = at;
    at += align_up((size_t(rows) + 1) * sizeof(int));
    l.cub = at;
    l.cub_bytes = cub_sort_bytes(rows, vocab);
    at += align_up(l.cub_bytes);
  }
  l.total = at + kAlign;  // slack to align the caller's base pointer
  return l;
}

void check_shape(int rows, int vocab) {
  check(rows > 0 && vocab > 0, "sample: rows = {} and vocab = {} must be positive", rows, vocab);
  check(int64_t(rows) * vocab <= INT_MAX, "sample: rows x vocab = {} x {} exceeds 2^31 - 1 logits", rows, vocab);
}

}  // namespace

size_t sampling_workspace_bytes(int rows, int vocab) {
  check_shape(rows, vocab);
  return make_layout(rows, vocab, true).total;
}

void sample(float* logits, int rows, int vocab, const int32_t* history, const int32_t* history_lens,
            int history_stride, const DeviceSamplingParams& params, const uint64_t* offsets, int32_t* out_ids,
            void* workspace, size_t workspace_bytes, cudaStream_t stream, const uint64_t* seeds,
            const LogitAdjust* adjust) {
  check(logits != nullptr && out_ids != nullptr, "sample: null pointer (logits {}, out_ids {})",
        static_cast<const void*>(logits), static_cast<const void*>(out_ids));
  check_shape(rows, vocab);
  // The CPU Sampler's parameter checks.
  check(std::isfinite(params.temperature), "sample: temperature must be a finite number");
  check(params.top_p > 0 && params.top_p <= 1.0f, "sample: top-p = {} must be in (0, 1]", params.top_p);
  check(params.min_p >= 0 && params.min_p <= 1.0f, "sample: min-p = {} must be in [0, 1]", params.min_p);
  check(params.repeat_penalty > 0 && std::isfinite(params.repeat_penalty), "sample: repeat penalty = {} must be positive",
        params.repeat_penalty);

  const bool penalize = params.repeat_penalty != 1.0f && history != nullptr;
  const bool bias = adjust != nullptr && adjust->bias_offsets != nullptr;
  const bool counts = adjust != nullptr && adjust->generated_offsets != nullptr;
  if (bias) check(adjust->bias_ids != nullptr && adjust->bias_values != nullptr, "sample: bias offsets without entries");
  if (counts)
    check(adjust->generated_ids != nullptr && adjust->presence != nullptr && adjust->frequency != nullptr,
          "sample: generated offsets without ids or penalties");
  const bool greedy = params.temperature <= 0.0f;
  const bool select_path = !greedy && params.top_k >= 1 && params.top_k <= kTopKMax;
  const bool sort_path = !greedy && !select_path;
  if (penalize) {
    check(history_lens != nullptr, "sample: history given without history_lens");
    check(history_stride >= 0, "sample: history_stride = {} is negative", history_stride);
  }
  if (!greedy) check(offsets != nullptr, "sample: offsets are required when temperature > 0");

  char* base = nullptr;
  Layout layout;
  if (penalize || counts || sort_path) {
    layout = make_layout(rows, vocab, sort_path);
    check(workspace != nullptr && workspace_bytes >= layout.total,
          "sample: workspace of {} bytes at {} is too small ({} bytes needed for {} x {})", workspace_bytes, workspace,
          layout.total, rows, vocab);
    base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
  }

  if (bias) {
    bias_kernel<<<rows, 32, 0, stream>>>(logits, vocab, adjust->bias_offsets, adjust->bias_ids, adjust->bias_values);
    check_launch("sample/bias");
  }
  if (penalize) {
    penalty_kernel<<<rows, kPenaltyThreads, 0, stream>>>(logits, vocab, history, history_lens, history_stride,
                                                         params.repeat_penalty, reinterpret_cast<int*>(base + layout.ids0));
    check_launch("sample/penalty");
  }
  if (counts) {
    count_penalty_kernel<<<rows, kPenaltyThreads, 0, stream>>>(logits, vocab, adjust->generated_offsets,
                                                               adjust->generated_ids, adjust->presence,
                                                               adjust->frequency, reinterpret_cast<int*>(base + layout.ids0));
    check_launch("sample/count_penalty");
  }

  if (greedy) {
    argmax_kernel<<<rows, kArgmaxThreads, 0, stream>>>(logits, vocab, out_ids);
    check_launch("sample/argmax");
    return;
  }

  if (select_path) {
    const int k = params.top_k < vocab ? params.top_k : vocab;
    topk_sample_kernel<<<rows, kBlock, 0, stream>>>(logits, vocab, k, params.temperature, params.top_p, params.min_p,
                                                    params.seed, seeds, offsets, out_ids);
    check_launch("sample/topk_sample");
    return;
  }

  float* keys0 = reinterpret_cast<float*>(base + layout.keys0);
  float* keys1 = reinterpret_cast<float*>(base + layout.keys1);
  int* ids0 = reinterpret_cast<int*>(base + layout.ids0);
  int* ids1 = reinterpret_cast<int*>(base + layout.ids1);
  int* segments = reinterpret_cast<int*>(base + layout.segments);
  sort_prep_kernel<<<rows, kPrepThreads, 0, stream>>>(logits, rows, vocab, params.temperature, keys0, ids0, segments);
  check_launch("sample/sort_prep");
  cub::DoubleBuffer<float> keys(keys0, keys1);
  cub::DoubleBuffer<int> ids(ids0, ids1);
  size_t cub_bytes = layout.cub_bytes;
  if (rows == 1) {
    cuda_check(cub::DeviceRadixSort::SortPairsDescending(base + layout.cub, cub_bytes, keys, ids, vocab, 0, 32, stream),
               "sample/cub::DeviceRadixSort::SortPairsDescending");
  } else {
    cuda_check(cub::DeviceSegmentedRadixSort::SortPairsDescending(base + layout.cub, cub_bytes, keys, ids,
                                                                   rows * vocab, rows, segments, segments + 1, 0, 32,
                                                                   stream),
               "sample/cub::DeviceSegmentedRadixSort::SortPairsDescending");
  }
  check_launch("sample/segmented_sort");
  const int n = params.top_k > 0 && params.top_k < vocab ? params.top_k : vocab;
  sorted_sample_kernel<<<rows, kBlock, 0, stream>>>(keys.Current(), ids.Current(), vocab, n, params.top_p,
                                                    params.min_p, params.seed, seeds, offsets, out_ids);
  check_launch("sample/sorted_sample");
}

void token_logprobs(const float* logits, int vocab, const int32_t* rows, int count, const int32_t* tokens, int k,
                    float* out, int out_stride, cudaStream_t stream) {
  check(vocab > 0 && count >= 0 && k >= 0 && k <= vocab && out_stride >= 2 + 2 * k,
        "token_logprobs: vocab {} count {} k {} out_stride {}", vocab, count, k, out_stride);
  if (count == 0) return;
  check(logits != nullptr && rows != nullptr && tokens != nullptr && out != nullptr, "token_logprobs: null pointer");
  logprobs_kernel<<<count, kBlock, 0, stream>>>(logits, vocab, rows, tokens, k, out, out_stride);
  check_launch("token_logprobs");
}

namespace {
__global__ void token_mask_kernel(float* logits, int vocab, const uint32_t* masks, int words, const int32_t* head_rows) {
  const int r = blockIdx.y;
  float* row = logits + static_cast<size_t>(head_rows[r]) * vocab;
  const uint32_t* m = masks + static_cast<size_t>(r) * words;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x)
    if (!((m[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
}
}  // namespace

namespace {
__global__ void resolve_drawn_tokens_kernel(int32_t* ids, int n, const int32_t* drawn) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t v = ids[i];
    if (v <= -2) ids[i] = drawn[-2 - v];
  }
}
}  // namespace

void resolve_drawn_tokens(int32_t* ids, int n, const int32_t* drawn, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  resolve_drawn_tokens_kernel<<<std::min((n + threads - 1) / threads, 32), threads, 0, stream>>>(ids, n, drawn);
  check_launch("sample/resolve_drawn_tokens");
}

void apply_token_masks(float* logits, int vocab, const uint32_t* masks, int words, const int32_t* head_rows, int count,
                       cudaStream_t stream) {
  if (count <= 0) return;
  const int threads = 256;
  const int blocks = std::min((vocab + threads - 1) / threads, 64);
  token_mask_kernel<<<dim3(blocks, count), threads, 0, stream>>>(logits, vocab, masks, words, head_rows);
  check_launch("sample/token_mask");
}

}  // namespace fdpp::cuda
