// How fast can a decode-attention kernel stream its K/V cache? Pure copies (no math) of one decode
// step's K and V in the access patterns of fdpp's kernels, of cuDNN's decode kernel, and of plain
// linear sweeps, each timed on the same buffers (issue 13: the tensor-core loop streamed at 95% of
// 4.46 TB/s where cuDNN's SDPA reached 100-103%; docs/results/2026-12-01p-stream-patterns.md).
//
//   fdpp_kv_stream_bench [--batch 64] [--kv-heads 8] [--context 16384]
//
// K and V: batch x kv_heads x context rows of 256 bytes (head_dim 128, 16-bit) each, in either
// layout of the cache: token-major ([token][kv head][D], the engine's; a 16-key tile of one head is
// 16 rows 2 KB apart at 8 kv heads) or head-major dense ([kv head][token][D], cuDNN's input).
// Every kernel reads every byte once; one "group" is a (sequence, kv head) row, as one CTA group of
// decode attention. Median of 7 timed launches after one warm-up, events around each launch; GB/s
// counts the bytes of K and V.
//
// Patterns:
//   warp_ring   fdpp's tensor-core loop: every warp streams its own 16-key tiles (tile t to warp
//               t % W) through a private ring of NS stages with cp.async (L2::128B), NS - 1 tiles
//               in flight. One CTA per group and split (grid groups x splits). Rows land 272 bytes
//               apart in shared memory (the former kernels' 16-byte pad), or 256 ("unpadded": the
//               kernels' layout since run s, which reads as much as a linear sweep).
//   warp_ring_x warp_ring with the 8 warps' rows interleaved, so the warps share every 4 KB.
//   cta_tile    cuDNN's decode kernel (ncu: 4 warps, 128-key tiles, 86 KB, two CTAs per SM): the
//               CTA loads one K tile, then one V tile, cooperatively, a barrier between.
//   cta_ring    CTA-cooperative tiles of KT keys through NS stages.
//   lean_ring   warp_ring with a persistent ("lean", stream-K) decomposition: CTA c takes the
//               c-th equal share of all groups' tiles, crossing groups.
//   lean_cta    cta_tile over the dense tensors with the lean decomposition.
//   dyn_cta     persistent CTAs taking work items (a chunk of one group's tiles) from a global
//               counter, in group-major or chunk-major order; the warps stream an item as warp_ring.
//   dyn_warp    the same with every warp taking its own items, its ring running on across them.
//   sweep_*     the whole grid walks K and V linearly (grid-stride): at any moment every SM reads
//               within a few MB. ldcs: 16-byte loads to registers; cp.async: NS-stage rings.
//   chunks_*    CTA c reads the c-th contiguous chunk of K and V (with as many chunks as groups: one
//               CTA per group, head-major): ldcs, 16-byte register loads; cp.async, NS-stage rings.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

#define KV_CHECK(x)                                                                      \
  do {                                                                                   \
    const cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                              \
      std::fprintf(stderr, "kv_stream_bench: %s: %s\n", #x, cudaGetErrorString(e));     \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kRowBytes = 256;    // one key's row of one head: head_dim 128, 16-bit
constexpr int kStageRow = 272;    // staged row stride (16 bytes of padding, as the kernels stage)
constexpr int kChunks = kRowBytes / 16;

__device__ __forceinline__ void cp16(void* smem, const void* gmem) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(d), "l"(gmem) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

struct Layout {
  const char* k;
  const char* v;
  int context, kv_heads;
  long long row_stride, head_stride, seq_stride;  // bytes
  int splits;  // warp_ring, cta_*: key slices per group
  int* sink;   // written only if the xor of the data is an impossible value: keeps the loads live
};

__device__ __forceinline__ long long row_offset(const Layout& p, int group, int key) {
  const int b = group / p.kv_heads, h = group % p.kv_heads;
  return b * p.seq_stride + h * p.head_stride + key * p.row_stride;
}

// This CTA's tiles of KT keys [t0, t1), numbered across groups (tile t: group t / tiles_per_group,
// keys from (t % tiles_per_group) * KT). Lean: the blockIdx.x-th equal share of all groups' tiles
// (p.splits holds the group count); else group blockIdx.x, key slice blockIdx.y of p.splits.
template <int KT, bool kLean>
__device__ __forceinline__ void tile_range(const Layout& p, long long& t0, long long& t1) {
  const int tiles_per_group = p.context / KT;
  if constexpr (kLean) {
    const long long all = (long long)p.splits * tiles_per_group;
    t0 = all * blockIdx.x / gridDim.x;
    t1 = all * (blockIdx.x + 1) / gridDim.x;
  } else {
    const int per = (tiles_per_group + p.splits - 1) / p.splits;
    const int begin = blockIdx.y * per, end = min(tiles_per_group, begin + per);
    t0 = (long long)blockIdx.x * tiles_per_group + begin;
    t1 = (long long)blockIdx.x * tiles_per_group + end;
  }
}

// Copies tile t (KT keys of one group, numbered across groups) into a warp's stage: K rows, then V
// rows at kd + KT rows.
template <int KT, int kRow = kStageRow>
__device__ __forceinline__ void copy_tile(const Layout& p, long long t, unsigned char* kd, int lane) {
  constexpr int kRowsPerStep = 32 / kChunks, kSteps = KT / kRowsPerStep;
  const int lane_row = lane / kChunks, lane_chunk = lane % kChunks;
  const int tiles_per_group = p.context / KT;
  const int group = int(t / tiles_per_group), key0 = int(t % tiles_per_group) * KT;
  unsigned char* vd = kd + KT * kRow;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int r = step * kRowsPerStep + lane_row;
    const long long o = row_offset(p, group, key0 + r) + lane_chunk * 16;
    cp16(kd + r * kRow + lane_chunk * 16, p.k + o);
    cp16(vd + r * kRow + lane_chunk * 16, p.v + o);
  }
}

// Drives a warp's ring of NS stages of stage_bytes: NS - 1 issues ahead, then for each tile i while
// more(i): wait for it, issue tile i + NS - 1 into the stage just freed, read a word of tile i.
// Returns the xor of the words read.
template <int NS, class Issue, class More>
__device__ __forceinline__ int drive_ring(Issue&& issue, More&& more, const unsigned char* stage, int stage_bytes,
                                          int lane) {
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i, i);
  int acc = 0;
  for (long long i = 0; more(i); ++i) {
    wait_group<NS - 2>();
    __syncwarp();
    issue(i + NS - 1, int((i + NS - 1) % NS));
    acc ^= *reinterpret_cast<const int*>(stage + (i % NS) * stage_bytes + lane * 4);
  }
  wait_group<0>();
  return acc;
}

// The warps of a CTA stream tiles [t0, t1) round-robin (tile t0 + warp + n W is the warp's n-th),
// each through its own ring of NS stages, NS - 1 tiles in flight. Returns the xor of what it read.
template <int W, int NS, int KT, int kRow = kStageRow>
__device__ __forceinline__ int ring_tiles(const Layout& p, unsigned char* stage, long long t0, long long t1, int warp,
                                          int lane) {
  auto issue = [&](long long n, int s) {
    const long long t = t0 + warp + n * W;
    if (t < t1) copy_tile<KT, kRow>(p, t, stage + s * 2 * KT * kRow, lane);
    commit();
  };
  return drive_ring<NS>(issue, [&](long long i) { return t0 + warp + i * W < t1; }, stage, 2 * KT * kRow, lane);
}

template <int W, int NS, int KT, bool kLean, int kRow = kStageRow>
__global__ void __launch_bounds__(W * 32) warp_ring(Layout p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long t0, t1;
  tile_range<KT, kLean>(p, t0, t1);
  const int acc = ring_tiles<W, NS, KT, kRow>(p, smem + warp * NS * 2 * KT * kRow, t0, t1, warp, lane);
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

// warp_ring with the warps' tiles interleaved: the warps' n-th tiles together cover one span of
// W x 16 keys, warp w taking keys 16 m + 2 w and 16 m + 2 w + 1 (m = 0..7) of it, so that every
// 512-byte step of a warp lies in a different 4 KB (head-major) of the span and the W warps fill
// each 4 KB together, as the CTA-wide chunk walks do. Tiles [t0, t1) of 16 keys, t1 - t0 a
// multiple of W (whole spans).
template <int W, int NS>
__global__ void __launch_bounds__(W * 32) warp_ring_x(Layout p) {
  static_assert(W == 8, "8 warps x 2 rows fill each 16-row block of the span");
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long t0, t1;
  tile_range<16, false>(p, t0, t1);
  unsigned char* stage = smem + warp * NS * 2 * 16 * kStageRow;
  const int tiles_per_group = p.context / 16;
  const long long spans = (t1 - t0) / W;
  const int lane_row = lane / kChunks, lane_chunk = lane % kChunks;
  auto issue = [&](long long n, int s) {
    if (n < spans) {
      const long long t = t0 + n * W;  // the span's first tile
      const int group = int(t / tiles_per_group), key0 = int(t % tiles_per_group) * 16 + 2 * warp + lane_row;
      unsigned char* kd = stage + s * 2 * 16 * kStageRow;
      unsigned char* vd = kd + 16 * kStageRow;
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const int r = 2 * m + lane_row;
        const long long o = row_offset(p, group, key0 + 16 * m) + lane_chunk * 16;
        cp16(kd + r * kStageRow + lane_chunk * 16, p.k + o);
        cp16(vd + r * kStageRow + lane_chunk * 16, p.v + o);
      }
    }
    commit();
  };
  const int acc = drive_ring<NS>(issue, [&](long long n) { return n < spans; }, stage, 2 * 16 * kStageRow, lane);
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

// Dynamic (work-stealing) decompositions over persistent CTAs: work items of chunk_tiles 16-key tiles
// of one group, taken in order from a global counter (zero before the launch). Item i is chunk
// i % chunks of group i / chunks (group-major: the CTAs at work share few groups) or chunk i / groups
// of group i % groups (chunk-major: every group advances together).
__device__ __forceinline__ void item_tiles(const Layout& p, int item, int chunk_tiles, int groups, bool chunk_major,
                                           long long& t0) {
  const int tiles_per_group = p.context / 16, chunks = tiles_per_group / chunk_tiles;
  const int group = chunk_major ? item % groups : item / chunks;
  const int chunk = chunk_major ? item / groups : item % chunks;
  t0 = (long long)group * tiles_per_group + (long long)chunk * chunk_tiles;
}

// dyn_cta: the CTA takes an item, its warps stream it as warp_ring does, the rings drain, the next.
template <int W, int NS>
__global__ void __launch_bounds__(W * 32) dyn_cta(Layout p, int chunk_tiles, int groups, bool chunk_major,
                                                  int* counter) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int item_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_items = groups * (p.context / 16 / chunk_tiles);
  int acc = 0;
  for (;;) {
    __syncthreads();  // every thread has read item_s
    if (threadIdx.x == 0) item_s = atomicAdd(counter, 1);
    __syncthreads();
    const int item = item_s;
    if (item >= n_items) break;
    long long t0;
    item_tiles(p, item, chunk_tiles, groups, chunk_major, t0);
    acc ^= ring_tiles<W, NS, 16>(p, smem + warp * NS * 2 * 16 * kStageRow, t0, t0 + chunk_tiles, warp, lane);
  }
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

// dyn_warp: every warp takes its own items and streams each alone, its ring running on from one item
// into the next (the next item is taken one item ahead).
template <int NS>
__global__ void __launch_bounds__(256) dyn_warp(Layout p, int chunk_tiles, int groups, bool chunk_major,
                                                int* counter) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_items = groups * (p.context / 16 / chunk_tiles);
  unsigned char* stage = smem + warp * NS * 2 * 16 * kStageRow;
  auto take = [&] { return lane == 0 ? atomicAdd(counter, 1) : 0; };
  int item = __shfl_sync(0xffffffffu, take(), 0);
  int next_item = take();  // (lane 0's value is the one used)
  long long t0 = 0;
  if (item < n_items) item_tiles(p, item, chunk_tiles, groups, chunk_major, t0);
  long long issued = 0;
  bool done = item >= n_items;
  auto issue = [&](long long n, int s) {
    if (!done) {
      const int within = int(n % chunk_tiles);
      if (n > 0 && within == 0) {
        item = __shfl_sync(0xffffffffu, next_item, 0);
        next_item = take();
        done = item >= n_items;
        if (!done) item_tiles(p, item, chunk_tiles, groups, chunk_major, t0);
      }
      if (!done) {
        copy_tile<16>(p, t0 + within, stage + s * 2 * 16 * kStageRow, lane);
        ++issued;
      }
    }
    commit();
  };
  // (issued grows as the ring runs on into new items.)
  const int acc = drive_ring<NS>(issue, [&](long long i) { return i < issued; }, stage, 2 * 16 * kStageRow, lane);
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

// One K tile, then one V tile, each loaded by the whole CTA (FA2's order: V(j) loads while S(j)
// would be computed, K(j + 1) while P V(j)).
template <int W, int KT, bool kLean>
__global__ void __launch_bounds__(W * 32) cta_tile(Layout p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x;
  const int tiles_per_group = p.context / KT;
  long long t0, t1;
  tile_range<KT, kLean>(p, t0, t1);
  unsigned char* kb = smem;
  unsigned char* vb = smem + KT * kStageRow;
  constexpr int kThreads = W * 32, kPer = KT * kChunks / kThreads;
  auto load = [&](const char* src, unsigned char* dst, long long t) {
    const int group = int(t / tiles_per_group), key0 = int(t % tiles_per_group) * KT;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int i = q * kThreads + tid, r = i / kChunks, c = i % kChunks;
      cp16(dst + r * kStageRow + c * 16, src + row_offset(p, group, key0 + r) + c * 16);
    }
    commit();
  };
  int acc = 0;
  if (t0 < t1) load(p.k, kb, t0);
  for (long long t = t0; t < t1; ++t) {
    wait_group<0>();
    __syncthreads();
    load(p.v, vb, t);
    acc ^= *reinterpret_cast<const int*>(kb + tid * 4);
    wait_group<0>();
    __syncthreads();
    if (t + 1 < t1) load(p.k, kb, t + 1);
    acc ^= *reinterpret_cast<const int*>(vb + tid * 4);
  }
  wait_group<0>();
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

template <int W, int KT, int NS>
__global__ void __launch_bounds__(W * 32) cta_ring(Layout p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x;
  const int tiles_per_group = p.context / KT;
  long long t0, t1;
  tile_range<KT, false>(p, t0, t1);
  constexpr int kThreads = W * 32, kPer = KT * kChunks / kThreads;
  auto issue = [&](long long t, int s) {
    if (t < t1) {
      unsigned char* kd = smem + s * 2 * KT * kStageRow;
      unsigned char* vd = kd + KT * kStageRow;
#pragma unroll
      for (int q = 0; q < kPer; ++q) {
        const int i = q * kThreads + tid, r = i / kChunks, c = i % kChunks;
        const long long o = row_offset(p, blockIdx.x, int(t % tiles_per_group) * KT + r) + c * 16;
        cp16(kd + r * kStageRow + c * 16, p.k + o);
        cp16(vd + r * kStageRow + c * 16, p.v + o);
      }
    }
    commit();
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(t0 + i, i);
  int acc = 0;
  int i = 0;
  for (long long t = t0; t < t1; ++i, ++t) {
    wait_group<NS - 2>();
    __syncthreads();
    issue(t + NS - 1, (i + NS - 1) % NS);
    acc ^= *reinterpret_cast<const int*>(smem + (i % NS) * 2 * KT * kStageRow + tid * 4);
  }
  wait_group<0>();
  if (acc == 0x7fffffff) p.sink[0] = acc;
}

// Linear sweeps of K and V together (n 16-byte words each), grid-stride.
__global__ void sweep_ldcs(const int4* __restrict__ k, const int4* __restrict__ v, size_t n, int* sink) {
  int acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i + stride < n; i += 2 * stride) {
    const int4 a = __ldcs(k + i), b = __ldcs(k + i + stride), c = __ldcs(v + i), d = __ldcs(v + i + stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  if (acc == 0x7fffffff) sink[0] = acc;
}

// cp.async rings of NS stages, each kPerStep 16-byte words of K and of V per thread. Linear sweeps
// (kChunks false): the whole grid walks K and V together, grid-stride. Chunks: CTA c walks the c-th
// contiguous chunk of K and V, its threads side by side (as the sweep, but each CTA on its own).
template <int NS, int kPerStep, bool kChunks>
__global__ void __launch_bounds__(256) cp_async_walk(const int4* k, const int4* v, size_t n, int* sink) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int4* stage = reinterpret_cast<int4*>(smem) + warp * NS * kPerStep * 2 * 32;
  // Word of (step it, sub-step q): first + (it * kPerStep + q) * stride.
  const size_t per = n / gridDim.x;
  const size_t first = kChunks ? blockIdx.x * per + threadIdx.x : size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = kChunks ? size_t(blockDim.x) : size_t(gridDim.x) * blockDim.x;
  const size_t steps = (kChunks ? per : n) / (stride * kPerStep);
  auto issue = [&](size_t it, int s) {
    if (it < steps) {
#pragma unroll
      for (int q = 0; q < kPerStep; ++q) {
        const size_t i = first + (it * kPerStep + q) * stride;
        cp16(stage + ((s * kPerStep + q) * 2) * 32 + lane, k + i);
        cp16(stage + ((s * kPerStep + q) * 2 + 1) * 32 + lane, v + i);
      }
    }
    commit();
  };
  for (int s = 0; s < NS - 1; ++s) issue(s, s);
  int acc = 0;
  for (size_t it = 0; it < steps; ++it) {
    wait_group<NS - 2>();
    issue(it + NS - 1, (it + NS - 1) % NS);
    acc ^= stage[(it % NS) * kPerStep * 2 * 32 + lane].x;
  }
  wait_group<0>();
  if (acc == 0x7fffffff) sink[0] = acc;
}

__global__ void chunks_ldcs(const int4* __restrict__ k, const int4* __restrict__ v, size_t n, int* sink) {
  int acc = 0;
  const size_t per = n / gridDim.x, b0 = blockIdx.x * per;
  for (size_t i = b0 + threadIdx.x; i + blockDim.x < b0 + per; i += 2 * blockDim.x) {
    const int4 a = __ldcs(k + i), b = __ldcs(k + i + blockDim.x), c = __ldcs(v + i), d = __ldcs(v + i + blockDim.x);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  if (acc == 0x7fffffff) sink[0] = acc;
}

template <class Launch>
double median_ms(Launch launch) {
  cudaEvent_t a, b;
  KV_CHECK(cudaEventCreate(&a));
  KV_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = -1; r < 7; ++r) {
    KV_CHECK(cudaEventRecord(a));
    launch();
    KV_CHECK(cudaEventRecord(b));
    KV_CHECK(cudaEventSynchronize(b));
    KV_CHECK(cudaGetLastError());
    float t = 0.f;
    KV_CHECK(cudaEventElapsedTime(&t, a, b));
    if (r >= 0) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int arg_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) {
      const int v = std::atoi(argv[i + 1]);
      if (v <= 0) {
        std::fprintf(stderr, "kv_stream_bench: %s %s is not a positive integer\n", name, argv[i + 1]);
        std::exit(2);
      }
      return v;
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int batch = arg_int(argc, argv, "--batch", 64), kv_heads = arg_int(argc, argv, "--kv-heads", 8);
  const int context = arg_int(argc, argv, "--context", 16384) / 128 * 128;  // whole 128-key tiles
  if (context == 0) {
    std::fprintf(stderr, "kv_stream_bench: --context must be at least 128\n");
    return 2;
  }
  const int groups = batch * kv_heads;
  const size_t bytes = size_t(groups) * context * kRowBytes;  // of K (and of V)
  char *k = nullptr, *v = nullptr;
  int* sink = nullptr;
  int* counter = nullptr;
  KV_CHECK(cudaMalloc(&k, bytes));
  KV_CHECK(cudaMalloc(&v, bytes));
  KV_CHECK(cudaMalloc(&sink, 64));
  KV_CHECK(cudaMalloc(&counter, sizeof(int)));
  KV_CHECK(cudaMemset(k, 1, bytes));
  KV_CHECK(cudaMemset(v, 1, bytes));
  int sms = 0;
  KV_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double total = 2.0 * bytes;
  std::printf("K and V: %d sequences x %d kv heads x %d keys x 256 B = 2 x %.0f MB, %d SMs\n", batch, kv_heads, context,
              bytes / 1e6, sms);
  std::printf("| pattern | layout | grid | CTAs/SM | GB/s | us |\n| --- | --- | --- | ---: | ---: | ---: |\n");
  auto report = [&](const char* pattern, const char* layout, const char* grid, int per_sm, double ms) {
    std::printf("| %s | %s | %s | %d | %.0f | %.1f |\n", pattern, layout, grid, per_sm, total / (ms * 1e-3) / 1e9,
                ms * 1e3);
  };
  const size_t words = bytes / 16;
  report("sweep_ldcs", "linear", "8 x 256 threads / SM", 8,
         median_ms([&] { sweep_ldcs<<<sms * 8, 256>>>((const int4*)k, (const int4*)v, words, sink); }));
  {
    auto kernel = cp_async_walk<3, 2, false>;
    const int smem = 8 * 3 * 2 * 2 * 32 * 16;
    KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int per_sm : {1, 2}) {
      report("sweep_cp_async NS 3", "linear", "256 threads / CTA", per_sm, median_ms([&] {
               kernel<<<sms * per_sm, 256, smem>>>((const int4*)k, (const int4*)v, words, sink);
             }));
    }
  }
  for (int per_sm : {2, 4})
    for (int threads : {256, 512}) {
      char grid[64];
      std::snprintf(grid, sizeof grid, "%d threads / CTA", threads);
      report("chunks_ldcs", "linear", grid, per_sm, median_ms([&] {
               chunks_ldcs<<<sms * per_sm, threads>>>((const int4*)k, (const int4*)v, words, sink);
             }));
    }
  // Contiguous chunks with register loads or cp.async rings: as many chunks as SM slots, or one per
  // group (each group's K, and V, is one chunk of the linear buffers: the head-major layout).
  {
    // NS stages of kPerStep 4 KB steps of K and of V: (NS - 1) x kPerStep x 8 KB in flight per CTA.
    auto chunks = [&](const char* pattern, auto kernel, int ns, int per_step) {
      const int smem = 8 * ns * per_step * 2 * 32 * 16;
      KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      for (int n_chunks : {sms * 2, sms * 4, groups}) {
        char grid[64];
        std::snprintf(grid, sizeof grid, "%d chunks x 256 threads", n_chunks);
        report(pattern, "linear", grid, 0, median_ms([&] {
                 kernel<<<n_chunks, 256, smem>>>((const int4*)k, (const int4*)v, words, sink);
               }));
      }
    };
    chunks("chunks_cp_async NS 3, 2 x 4 KB", cp_async_walk<3, 2, true>, 3, 2);
    chunks("chunks_cp_async NS 2, 2 x 4 KB", cp_async_walk<2, 2, true>, 2, 2);
    chunks("chunks_cp_async NS 3, 4 x 4 KB", cp_async_walk<3, 4, true>, 3, 4);
    chunks("chunks_cp_async NS 5, 2 x 4 KB", cp_async_walk<5, 2, true>, 5, 2);
    chunks("chunks_cp_async NS 5, 4 x 4 KB", cp_async_walk<5, 4, true>, 5, 4);
    chunks("chunks_cp_async NS 3, 8 x 4 KB", cp_async_walk<3, 8, true>, 3, 8);
    for (int threads : {256, 512}) {
      char grid[64];
      std::snprintf(grid, sizeof grid, "%d groups x %d threads", groups, threads);
      report("chunks_ldcs (one per group)", "linear", grid, 0, median_ms([&] {
               chunks_ldcs<<<groups, threads>>>((const int4*)k, (const int4*)v, words, sink);
             }));
    }
  }
  for (int head_major = 0; head_major < 2; ++head_major) {
    Layout p{};
    p.k = k;
    p.v = v;
    p.context = context;
    p.kv_heads = kv_heads;
    p.sink = sink;
    p.row_stride = head_major ? kRowBytes : (long long)kv_heads * kRowBytes;
    p.head_stride = head_major ? (long long)context * kRowBytes : kRowBytes;
    p.seq_stride = (long long)kv_heads * context * kRowBytes;
    const char* layout = head_major ? "head-major" : "token-major";
    // Grid groups x splits (lean: `ctas` CTAs over all groups' tiles).
    auto run = [&](const char* pattern, auto kernel, int threads, int smem, int splits, bool lean, int ctas_per_sm_mult) {
      KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      int per_sm = 0;
      KV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
      Layout q = p;
      q.splits = lean ? groups : splits;
      const dim3 grid = lean ? dim3(sms * per_sm * ctas_per_sm_mult) : dim3(groups, splits);
      char grid_text[64];
      if (lean) std::snprintf(grid_text, sizeof grid_text, "lean, %d CTAs", grid.x);
      else std::snprintf(grid_text, sizeof grid_text, "%d groups x %d splits", groups, splits);
      report(pattern, layout, grid_text, per_sm, median_ms([&] { kernel<<<grid, threads, smem>>>(q); }));
    };
    constexpr int kTile16 = 2 * 16 * kStageRow;
    for (int splits : {1, 2, 4, 8}) {
      run("warp_ring W 4, NS 3 (fdpp, 4 warps)", warp_ring<4, 3, 16, false>, 128, 4 * 3 * kTile16, splits, false, 1);
      run("warp_ring W 8, NS 3 (fdpp, 8 warps)", warp_ring<8, 3, 16, false>, 256, 8 * 3 * kTile16, splits, false, 1);
      run("warp_ring W 8, NS 2", warp_ring<8, 2, 16, false>, 256, 8 * 2 * kTile16, splits, false, 1);
      run("warp_ring_x W 8, NS 3 (interleaved)", warp_ring_x<8, 3>, 256, 8 * 3 * kTile16, splits, false, 1);
      run("warp_ring W 8, NS 3, rows unpadded", warp_ring<8, 3, 16, false, 256>, 256, 8 * 3 * 2 * 16 * 256, splits,
          false, 1);
      run("warp_ring W 4, NS 3, rows unpadded", warp_ring<4, 3, 16, false, 256>, 128, 4 * 3 * 2 * 16 * 256, splits,
          false, 1);
      run("warp_ring W 4, NS 2", warp_ring<4, 2, 16, false>, 128, 4 * 2 * kTile16, splits, false, 1);
      run("warp_ring W 4, NS 4", warp_ring<4, 4, 16, false>, 128, 4 * 4 * kTile16, splits, false, 1);
      run("cta_tile W 4, 128 keys (cuDNN)", cta_tile<4, 128, false>, 128, 2 * 128 * kStageRow, splits, false, 1);
      // cuDNN's 86 KB of shared memory per CTA: two CTAs per SM, not three.
      run("cta_tile W 4, 128 keys, 86 KB (cuDNN)", cta_tile<4, 128, false>, 128, 86 * 1024, splits, false, 1);
      run("cta_ring W 4, 64 keys, NS 3", cta_ring<4, 64, 3>, 128, 3 * 2 * 64 * kStageRow, splits, false, 1);
      run("cta_ring W 8, 64 keys, NS 3", cta_ring<8, 64, 3>, 256, 3 * 2 * 64 * kStageRow, splits, false, 1);
      run("cta_ring W 8, 128 keys, NS 3", cta_ring<8, 128, 3>, 256, 3 * 2 * 128 * kStageRow, splits, false, 1);
    }
    run("warp_ring W 4, NS 3 (lean)", warp_ring<4, 3, 16, true>, 128, 4 * 3 * kTile16, 1, true, 1);
    // Dynamic items: persistent CTAs (as many as fit), a counter zeroed before each launch.
    auto run_dynamic = [&](const char* pattern, auto kernel, int threads, int smem, int chunk_tiles, bool chunk_major) {
      if ((context / 16) % chunk_tiles != 0) return;
      KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      KV_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      int per_sm = 0;
      KV_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
      char grid_text[96];
      std::snprintf(grid_text, sizeof grid_text, "%d CTAs, items of %d keys, %s", sms * per_sm, chunk_tiles * 16,
                    chunk_major ? "chunk-major" : "group-major");
      report(pattern, layout, grid_text, per_sm, median_ms([&] {
               KV_CHECK(cudaMemsetAsync(counter, 0, sizeof(int)));
               kernel<<<sms * per_sm, threads, smem>>>(p, chunk_tiles, groups, chunk_major, counter);
             }));
    };
    for (const bool chunk_major : {false, true}) {
      for (int chunk_tiles : {64, 256})
        run_dynamic("dyn_cta W 8, NS 3", dyn_cta<8, 3>, 256, 8 * 3 * kTile16, chunk_tiles, chunk_major);
      for (int chunk_tiles : {64, 256})
        run_dynamic("dyn_cta W 4, NS 3", dyn_cta<4, 3>, 128, 4 * 3 * kTile16, chunk_tiles, chunk_major);
      for (int chunk_tiles : {8, 32, 128})
        run_dynamic("dyn_warp W 8, NS 3", dyn_warp<3>, 256, 8 * 3 * kTile16, chunk_tiles, chunk_major);
    }
    run("warp_ring W 8, NS 3 (lean)", warp_ring<8, 3, 16, true>, 256, 8 * 3 * kTile16, 1, true, 1);
    run("cta_tile W 4, 128 keys (lean)", cta_tile<4, 128, true>, 128, 2 * 128 * kStageRow, 1, true, 1);
  }
  cudaFree(k);
  cudaFree(v);
  cudaFree(sink);
  cudaFree(counter);
  return 0;
}
