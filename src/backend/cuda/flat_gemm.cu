// ImplB of FlashDecoding++'s linear-layer trio: the flat GEMM of decode on tensor cores,
// y[M, N] = x[M, K] . W[N, K]^T for M = 1..64 (see flat_gemm.h for the epilogues).
//
// Why "flat": decode's M is the batch (1..64) while N and K are the model's (4096..28672). Libraries
// tile M to 64 or 128 and waste the tensor cores and, worse, shared memory and registers on rows
// that do not exist. Here the mma is turned around: mma.sync m16n8k16 takes the WEIGHTS as its
// 16-row A operand and the TOKENS as the 8-wide B operand, so M is padded to 8, not 64, and the
// kernel is compiled for 1, 2, 4 or 8 such n8 token tiles (M <= 8, 16, 32, 64).
//
// Tiles. A CTA (8 warps) owns block_n = 64 weight rows and streams its share of K through shared
// memory in block_k = 128 slices (64 x 128 x 2 B = 16 KB of W, plus 8*m_tiles x 128 of x, per stage)
// with a cp.async pipeline `stages` deep (the weights carry an L2 evict-first policy: they are read
// once per step, and x and the split-K partials are what should stay in L2). The 8 warps split the
// 64 x 128 stage as WN warps along N (64 / WN rows each) times WK warps along K (128 / WK each); the
// WK partial sums are added in shared memory at the end in a fixed order.
//
// Fragments without ldmatrix: a K-reduction may visit K in any order as long as A and B use the
// same order. Lane (g = lane / 4, t = lane % 4) reads ONE 16-byte chunk (8 consecutive k) of weight
// row g, one of row g + 8 and one of token row g, all at chunk t of a 32-wide k group, and feeds
// them to two m16n8k16 mmas: the first takes the chunk's k 0-3 as the mma's logical k {2t, 2t+1,
// 2t+8, 2t+9}, the second k 4-7. So every shared-memory read is a 16-byte LDS, and rows r, r + 1
// are swizzled (chunk ^ 4 * (r & 1)) so that the 8 lanes of each quarter-warp hit 8 different
// 16-byte bank groups.
//
// Split-K. Where N / 64 tiles cannot give every SM two CTAs, K is split over `splits` CTAs per
// tile. Each writes its fp32 partial tile [M, 64] to the workspace, then bumps the tile's semaphore;
// the CTA that sees the count reach splits - 1 (the last to finish) sums the partials in split order
// (deterministic: no float atomics, whose order varies from run to run), applies the epilogue, and
// puts the semaphore back to zero, so the next launch - or the next replay of a CUDA graph - finds
// the workspace as the first one did. One launch, no second reduction kernel, no memset.
// (fp32 atomics into y were the alternative: they need a zeroed fp32 y, so they cannot serve the
// 16-bit Store and SwiGLU epilogues without a second pass, and their results change from run to run.)
//
// Measured on the H200 (fdpp_flat_gemm_bench, fp16, Store, graph of 20 calls over weights rotated
// past L2; bench/kernels/NOTES.md): Llama-2-7B QKV [12288, 4096] 81% of 4.46 TB/s at M = 1, 86-92%
// at M = 2..16; gate+up [22016, 4096] 88-91% at M = 1..16; but the split-K shapes reach less: O
// [4096, 4096] 63-66% at M = 1..8 (cuBLASLt 58-60%), down [4096, 11008] 65-71% (cuBLASLt 78-79%);
// M = 64 (m_tiles 8) only 31-44% (cuBLASLt 74-87%). Summed over the layer, flat is within +-3% of
// cuBLASLt for M <= 16, not the 1.15x the issue asked for.
//
// Workspace layout (flat_gemm.h's contract): [0, 16 KB) 4096 semaphores at fixed places, the
// partials after them. Fixed places are what let one buffer serve every shape: a call never finds
// another shape's partials where its semaphores live.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <mutex>
#include <type_traits>

#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/flat_gemm.h"
#include "backend/cuda/gguf_block_fields.cuh"
#include "backend/cuda/int4.h"
#include "backend/cuda/mma_fragments.cuh"
#include "backend/cuda/per_device.h"

namespace fdpp::cuda {

namespace {

using detail::check_launch;
using detail::cp_async_wait_group;
using detail::fp8x8_to;
using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;  // 8 warps
constexpr int kBlockN = 64;
constexpr int kBlockK = 128;
// 4-bit weights at up to 16 tokens: 256 k per stage (8 KB of words for 64 rows), so that a stage
// and its barrier carry half the bytes of a 16-bit one, not an eighth (their x tiles stay small).
constexpr int kBlockKInt4 = 256;
// GGUF blocks: a stage is 256 k (one super-block, or eight Q4_0 / Q4_1 / Q8_0 blocks) of each of
// the 64 rows. A row's slice in shared memory is the stored bytes as they are where those are whole
// 16-byte chunks (Q4_K 144, Q5_K 176, Q4_0 144, Q4_1 160, Q8_0 272 bytes, so every stage of a row
// starts aligned), or Q6_K's 210 bytes copied from the 16-byte boundary at or below them (2-byte
// aligned), in 224.
constexpr int kBlockKGguf = 256;
constexpr bool is_gguf(WeightFormat f) {
  return f == WeightFormat::GgufQ4K || f == WeightFormat::GgufQ6K || f == WeightFormat::GgufQ5K ||
         f == WeightFormat::GgufQ4_0 || f == WeightFormat::GgufQ4_1 || f == WeightFormat::GgufQ8_0;
}
// Bytes of 256 k of a row.
constexpr int gguf_block_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::GgufQ6K: return 210;
    case WeightFormat::GgufQ5K: return 176;
    case WeightFormat::GgufQ8_0: return 8 * 34;
    case WeightFormat::GgufQ4_1: return 8 * 20;
    default: return 144;  // Q4_K; Q4_0 (8 x 18)
  }
}
constexpr int gguf_slice_bytes(WeightFormat f) { return f == WeightFormat::GgufQ6K ? 224 : gguf_block_bytes(f); }
constexpr int kSemaphores = 4096;                // fixed semaphore slots at the workspace's start
constexpr size_t kSemaphoreBytes = kSemaphores * 4;
constexpr int kRedStride = kBlockN + 4;          // fp32 reduction rows, padded (bank spread)
constexpr size_t kSmemPerSm = 228 * 1024;        // H100/H200: 228 KB per SM, 1 KB reserved per CTA
constexpr size_t kSmemReservedPerCta = 1024;

// Warp layout per m_tiles: WN warps along N, WK along K (WN * WK = 8).
template <int MT>
struct WarpLayout {
  // M <= 32: one 16-row tile per warp along N, two warps along K; x is read by 4 warps per stage
  // (at MT = 4: 4 x 8 KB of LDS against 16 KB of W, well inside shared-memory bandwidth).
  static constexpr int WN = 4, WK = 2;
};
template <>
struct WarpLayout<8> {
  // M <= 64: two 16-row tiles per warp (64 fp32 accumulators) so that x (16 KB per stage) is read
  // by 2 warps, not 4.
  static constexpr int WN = 2, WK = 4;
};

constexpr int default_stages(int mt, WeightFormat format = WeightFormat::Bits16) {
  // GGUF blocks: 9-17 KB of weights and mt * 4 KB of x per stage: 4 stages at mt 1, 2 (53-102 KB),
  // 3 at mt 4, 8 (77-150 KB).
  if (is_gguf(format)) return mt <= 2 ? 4 : 3;
  // 4-bit weights: 4 stages of 256 k at mt 1, 2 (14 and 18 KB each) and of 128 k at mt 4.
  if (format == WeightFormat::Int4) return mt == 8 ? 3 : 4;
  // FP8 weights: half the bytes per stage, so deeper pipelines fit (6 at mt = 1, 4 at mt = 2, 4).
  if (format != WeightFormat::Bits16) return mt == 1 ? 6 : mt == 8 ? 3 : 4;
  // smem per stage: 16 KB of W + mt * 2 KB of x. 4 stages at mt = 1 (72 KB: 3 CTAs per SM),
  // 3 at mt = 2, 4 (60, 72 KB: 3 CTAs), 3 at mt = 8 (96 KB: 2 CTAs). Two or three stages in flight
  // per CTA, 2-3 CTAs per SM: 64-144 KB of loads in flight per SM, far above the ~35 KB that
  // 4.46 TB/s x ~1 us of latency / 132 SMs needs.
  return mt == 1 ? 4 : 3;
}

// K per stage: kBlockK, or kBlockKInt4 for 4-bit weights at m_tiles 1 and 2.
constexpr int block_k_for(WeightFormat format, int mt) {
  if (is_gguf(format)) return kBlockKGguf;
  return format == WeightFormat::Int4 && mt <= 2 ? kBlockKInt4 : kBlockK;
}

// 4-bit weights: a stage holds 64 rows x bk / 2 bytes of q4 words, then each row's zs words for the
// stage's bk weights (one per 32, at most) in bk / 8 bytes.
constexpr unsigned int4_w_bytes(int bk) { return unsigned(kBlockN * bk / 2); }
constexpr unsigned int4_zs_row_bytes(int bk) { return unsigned(bk / 8); }

constexpr unsigned weight_stage_bytes(WeightFormat format, int bk) {
  return format == WeightFormat::Int4  ? int4_w_bytes(bk) + kBlockN * int4_zs_row_bytes(bk)
         : is_gguf(format)             ? unsigned(kBlockN * gguf_slice_bytes(format))
         : format == WeightFormat::Fp8 ? kBlockN * bk
                                       : kBlockN * bk * 2;
}

size_t stage_bytes(int mt, WeightFormat format) {
  const int bk = block_k_for(format, mt);
  return weight_stage_bytes(format, bk) + size_t(mt) * 8 * bk * 2;
}

size_t smem_bytes_for(int mt, int stages, WeightFormat format) {
  const int wk = mt == 8 ? WarpLayout<8>::WK : WarpLayout<1>::WK;
  const size_t red = size_t(wk) * mt * 8 * kRedStride * 4;
  return std::max(stage_bytes(mt, format) * stages, red);
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// 16 bytes global -> shared, L1 bypassed, with an L2 eviction policy; zero-filled when !valid
// (src is then not read).
__device__ __forceinline__ void cp_async16_policy(unsigned dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
// The first `bytes` (0-16) of the 16 at src, the rest zero-filled, with an L2 eviction policy.
__device__ __forceinline__ void cp_async16_policy_bytes(unsigned dst, const void* src, int bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src), "r"(bytes),
               "l"(policy)
               : "memory");
}
// 4, 8 or 16 bytes through L1 (the zs words: every CTA of a row tile reads them).
template <int Bytes>
__device__ __forceinline__ void cp_async_ca(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(Bytes) : "memory");
}
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// Plain C++ shared loads (not asm): the compiler orders them against __syncthreads and schedules them.
// Programmatic dependent launch (cuda_common.cuh; kernel_options.h): the next kernel may launch once
// every CTA of this one has started; this kernel streams its first weight stages before waiting for
// the previous kernel (its x, y and workspace may be that kernel's), so a launch gap and the HBM
// ramp-up overlap the previous kernel's tail. Both are no-ops in a launch without the attribute.

__device__ __forceinline__ uint4 lds128(const unsigned char* smem, unsigned offset) {
  return *reinterpret_cast<const uint4*>(smem + offset);
}

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Shared-memory offset (bytes) of 16-byte chunk c of row r in a [rows][CK] tile (CK chunks per row, a
// multiple of 8).
template <int CK>
__device__ __forceinline__ unsigned swz(int r, int c) {
  return unsigned((r * CK + (c ^ ((r & 1) << 2))) * 16);
}

// FP8 weight tiles: a row is 128 bytes (8 16-byte chunks of 16 k). Lanes read 8-byte pieces (8 k,
// the span of one 16-bit chunk of x); 16-byte chunk j of row r sits at j ^ 2 * (r & 3), so that
// the 4 rows of a half-warp's 64-bit loads land in 4 different 32-byte bank groups.
__device__ __forceinline__ unsigned swz8(int r, int j) { return unsigned(r * 128 + ((j ^ ((r & 3) << 1)) * 16)); }

// 4-bit weight tiles: a row is BK / 2 bytes (BK / 32 16-byte chunks of 32 k); lanes read one 4-byte
// word (8 k). Chunk j of row r sits at j ^ (r & 7) in rows of 8 chunks, j ^ ((r >> 1) & 3) in rows
// of 4, so that the 8 rows x 4 words of a warp's loads fall in 32 different banks.
template <int BK>
__device__ __forceinline__ unsigned swz4(int r, int j) {
  if constexpr (BK == 256) return unsigned(r * 128 + ((j ^ (r & 7)) * 16));
  else return unsigned(r * 64 + ((j ^ ((r >> 1) & 3)) * 16));
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

struct Args {
  const void* x;
  const void* w;
  const void* bias;
  void* y;
  int M, N, K;
  int tiles_n, splits, k_tiles;
  Epilogue epilogue;
  float* partials;
  unsigned* semaphores;
  const float* w_scale;  // FP8 weights: per-row scales, applied in the epilogue
  const uint32_t* zs;    // 4-bit weights (int4.h): per-group scale and zero words
  int group_size, zs_stride;
  int ldy, col0;  // y's row stride and first column (Store, StoreF32, AddF32): N and 0 but for GGUF segments
};

// The GGUF weight formats and their ggml types: the one table both directions read.
struct GgufFormatType {
  WeightFormat format;
  uint32_t ggml_type;
};
constexpr GgufFormatType kGgufFormatTypes[] = {
    {WeightFormat::GgufQ4_0, detail::ggml_type::kQ4_0}, {WeightFormat::GgufQ4_1, detail::ggml_type::kQ4_1},
    {WeightFormat::GgufQ8_0, detail::ggml_type::kQ8_0}, {WeightFormat::GgufQ4K, detail::ggml_type::kQ4_K},
    {WeightFormat::GgufQ5K, detail::ggml_type::kQ5_K}, {WeightFormat::GgufQ6K, detail::ggml_type::kQ6_K},
};

// The ggml type of a GGUF weight format (kGgufFormatTypes; every caller passes a GGUF format).
constexpr uint32_t ggml_type_of(WeightFormat f) {
  for (const GgufFormatType& t : kGgufFormatTypes)
    if (t.format == f) return t.ggml_type;
  return detail::ggml_type::kQ8_0;
}

// Weights k = 8c .. 8c + 7 of a GGUF row's 256-k slice in shared memory, as 8 T.
template <class T, WeightFormat WF>
__device__ __forceinline__ uint4 gguf_chunk_to(const unsigned char* slice, int c) {
  if constexpr (WF == WeightFormat::GgufQ8_0) return detail::gguf_q8_0_chunk_to<T>(slice, c);
  else return detail::gguf_chunk_to<T, ggml_type_of(WF)>(slice, c);
}

// FP8: the weights are e4m3 bytes (fp8.h) with per-row scales; Int4: q4 words with per-group zs
// words (int4.h); GGUF: blocks as stored (gguf_block_fields.cuh). The tiles hold them as
// stored and each lane converts its pieces to T in registers before the MMA (FP8's row scale in the
// epilogue, the others' scales with the conversion).
template <class T, int MT, int STAGES, WeightFormat WF>
__global__ void __launch_bounds__(kThreads, MT == 8 ? 2 : 3) flat_gemm_kernel(const Args a) {
  constexpr bool W8 = WF == WeightFormat::Fp8, W4 = WF == WeightFormat::Int4, WG = is_gguf(WF);
  constexpr int BK = block_k_for(WF, MT);  // K per stage
  constexpr int CK = BK / 8;               // 16-byte chunks per 16-bit row of the stage (x, 16-bit W)
  static_assert(!W4 || BK == 128 || BK == 256, "4-bit tiles are laid out for 128 or 256 k per stage");
  using WL = WarpLayout<MT>;
  constexpr int WN = WL::WN, WK = WL::WK;
  constexpr int RT = kBlockN / 16 / WN;      // 16-row tiles per warp
  constexpr int KG = BK / 32 / WK;           // 32-wide k groups per warp per stage
  constexpr int XR = MT * 8;                 // token rows in smem (padded)
  constexpr unsigned kWBytes = weight_stage_bytes(WF, BK);
  constexpr unsigned kStageBytes = kWBytes + XR * BK * 2;
  constexpr unsigned kZsBytes = int4_zs_row_bytes(BK);  // a row's zs words per stage (4-bit)
  // 16-byte chunks per weight row per stage
  constexpr int kWChunks = WG ? gguf_slice_bytes(WF) / 16 : W4 ? BK / 32 : W8 ? BK / 16 : CK;
  // 4 (2 for FP8, 2 or 1 for 4-bit; GGUF: 3 to 5, the last pass partial)
  constexpr int kWLoads = (kBlockN * kWChunks + kThreads - 1) / kThreads;
  constexpr int kXChunks = XR * CK;                        // 128 .. 1024
  constexpr int kXLoads = (kXChunks + kThreads - 1) / kThreads;

  extern __shared__ __align__(128) unsigned char smem[];
  const unsigned smem_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tile = blockIdx.x, split = blockIdx.y;
  const int M = a.M, N = a.N, K = a.K;
  const bool swiglu = a.epilogue == Epilogue::SwiGLU;
  const int F = N / 2;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  // row r at r * K * 2, r * K (FP8), r * K / 2 (4-bit) or r * (K / 256) * gguf_block_bytes (GGUF) bytes
  const unsigned char* __restrict__ w = static_cast<const unsigned char*>(a.w);
  const int64_t gguf_row_bytes = WG ? int64_t(K / kBlockKGguf) * gguf_block_bytes(WF) : 0;

  // Weight row of local row r (clamped into the matrix: rows past the end load real data whose
  // results are never stored).
  auto w_row = [&](int r) -> int {
    if (!swiglu) return min(tile * kBlockN + r, N - 1);
    const int half = kBlockN / 2;
    const int f = min(tile * half + (r & (half - 1)), F - 1);
    return r < half ? f : F + f;
  };

  // Per-thread load assignments (fixed over the K loop): W chunk q = tid + 256 i -> row q / 16,
  // chunk q % 16 (16 consecutive threads read 256 contiguous bytes of one row). The chunk and the
  // swizzle are the same for every i (256 is a multiple of 16 and of 2 rows), only the row moves.
  const int ld_c = (tid % CK) * 8;
  const unsigned ld_dst = swz<CK>(tid / CK, tid % CK);
  constexpr unsigned kRowsPerPass = kThreads / CK;  // 16 (8 for 256-k stages)
  // FP8: chunk q = tid + 256 i -> row q / 8, chunk q % 8 (16 k each), 32 rows per pass; 4-bit: chunk
  // q -> row q / (BK / 32), chunk q % (BK / 32) (32 k each), 32 or 64 rows per pass; GGUF: row
  // q / (slice bytes / 16), chunk q % (slice bytes / 16), the chunk moving with i.
  constexpr unsigned kWRowsPerPass = kThreads / kWChunks;
  const int w_ld_c = W4 ? (tid % kWChunks) * 32 : W8 ? (tid % kWChunks) * 16 : ld_c;  // k of the thread's chunk
  int w_rows[kWLoads];
#pragma unroll
  for (int i = 0; i < kWLoads; ++i) w_rows[i] = w_row(min((tid + kThreads * i) / kWChunks, kBlockN - 1));
  // Token rows past M (the padding of the last n8 tile) are zero-filled without a read: at M = 1 the
  // other seven rows would otherwise fetch row 0 again from L2 every stage.
  int x_rows[kXLoads];
  bool x_real[kXLoads];
#pragma unroll
  for (int i = 0; i < kXLoads; ++i) {
    const int r = tid / CK + int(kRowsPerPass) * i;
    x_rows[i] = min(r, M - 1);
    x_real[i] = r < M;
  }
  const uint64_t policy = evict_first_policy();
  const uint32_t* zs_row = W4 && tid < kBlockN ? a.zs + int64_t(w_row(tid)) * a.zs_stride : nullptr;
  // 4-bit groups: log2 of the group size when it is a power of two (every size int4.h takes below
  // 256 is), so that a lane finds its group with shifts, not divisions; many_groups: a stage spans
  // more than one group.
  const int gs = a.group_size;
  const int gs_log2 = gs > 0 && (gs & (gs - 1)) == 0 ? __ffs(gs) - 1 : -1;
  const bool many_groups = gs > 0 && gs < BK;

  const int kt_begin = int(int64_t(split) * a.k_tiles / a.splits);
  const int kt_end = int(int64_t(split + 1) * a.k_tiles / a.splits);
  const int nk = kt_end - kt_begin;

  auto load_w = [&](int stage, int kt) {
    const int k = kt * BK + w_ld_c;
    const bool ok = k < K;  // K tail: zero-filled chunks (K is a multiple of 8, of 16 for FP8)
    const unsigned stage_base = smem_base + unsigned(stage) * kStageBytes;
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {
      if constexpr (WG) {  // K is whole super-blocks: no tail
        const int q = tid + kThreads * i;
        if (kBlockN * kWChunks % kThreads != 0 && q >= kBlockN * kWChunks) break;
        const int r = q / kWChunks, j = q % kWChunks;
        const unsigned dst = stage_base + unsigned(r * gguf_slice_bytes(WF) + 16 * j);
        const unsigned char* row = w + int64_t(w_rows[i]) * gguf_row_bytes;
        const unsigned char* first = row + int64_t(kt) * gguf_block_bytes(WF);
        if constexpr (WF != WeightFormat::GgufQ6K) {
          cp_async16_policy(dst, first + 16 * j, true, policy);
        } else {  // from the 16-byte boundary at or below the block; nothing past the row's end is read
          const uintptr_t src = (reinterpret_cast<uintptr_t>(first) & ~uintptr_t(15)) + 16 * uintptr_t(j);
          const uintptr_t end = reinterpret_cast<uintptr_t>(row + gguf_row_bytes);
          const int bytes = src >= end ? 0 : int(min(uintptr_t(16), end - src));
          cp_async16_policy_bytes(dst, reinterpret_cast<const void*>(src), bytes, policy);
        }
      } else if constexpr (W4) {
        const int r = tid / kWChunks + int(kWRowsPerPass) * i;
        cp_async16_policy(stage_base + swz4<BK>(r, tid % kWChunks),
                          w + int64_t(w_rows[i]) * (K / 2) + (ok ? k / 2 : 0), ok, policy);
      } else if constexpr (W8) {
        const int r = tid / kWChunks + int(kWRowsPerPass) * i;
        cp_async16_policy(stage_base + swz8(r, tid % kWChunks), w + int64_t(w_rows[i]) * K + (ok ? k : 0), ok, policy);
      } else {
        cp_async16_policy(stage_base + ld_dst + i * kRowsPerPass * CK * 16,
                          w + (int64_t(w_rows[i]) * K + (ok ? k : 0)) * 2, ok, policy);
      }
    }
    if constexpr (W4) {
      // Row tid's zs words for this stage: BK / gs of them for groups of 32, 64 and 128 below BK,
      // else the one group holding the stage (int4_group_problem allows no group straddling it).
      if (tid < kBlockN) {
        const unsigned dst = stage_base + int4_w_bytes(BK) + unsigned(tid) * kZsBytes;
        const int words = many_groups ? BK >> gs_log2 : 1;
        const int first = gs <= 0 ? 0 : gs_log2 >= 0 ? (kt * BK) >> gs_log2 : kt * BK / gs;
        const uint32_t* src = zs_row + first;
        if (words >= 4) {
          for (int q = 0; q < words; q += 4) cp_async_ca<16>(dst + q * 4, src + q);
        } else if (words == 2) {
          cp_async_ca<8>(dst, src);
        } else {
          cp_async_ca<4>(dst, src);
        }
      }
    }
  };
  auto load_x = [&](int stage, int kt) {
    const int k = kt * BK + ld_c;
    const bool ok = k < K;
    const unsigned base = smem_base + unsigned(stage) * kStageBytes + ld_dst;
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      if (kXChunks % kThreads == 0 || tid + kThreads * i < kXChunks)
        cp_async16_zfill(base + kWBytes + i * kRowsPerPass * CK * 16, x + int64_t(x_rows[i]) * K + (ok ? k : 0),
                         ok && x_real[i]);
    }
  };

  const int g = lane >> 2, t = lane & 3;
  const int wn = warp % WN, wk = warp / WN;
  // 4-bit weights at up to 16 tokens: two accumulator sets, for even and odd k groups, so that a
  // stage's MMAs form two dependent chains instead of one (their dequantization leaves the MMAs
  // fewer warps to hide behind); added before the reduction.
  constexpr int KA = W4 && MT <= 2 ? 2 : 1;
  float acc[KA][RT][MT][4];
#pragma unroll
  for (int ka = 0; ka < KA; ++ka)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[ka][rt][mt][i] = 0.f;

  // Prologue: the weights of the first STAGES - 1 stages, then (after the previous kernel is done:
  // PDL) their x, all in one cp.async group followed by empty groups, so that the main loop's
  // wait_group<STAGES - 2> counting is unchanged (at it = 0 it waits for the whole prologue).
  detail::pdl_trigger();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nk) load_w(s, kt_begin + s);
  detail::pdl_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nk) load_x(s, kt_begin + s);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) detail::cp_async_commit();
  for (int it = 0; it < nk; ++it) {
    cp_async_wait_group<STAGES - 2>();
    __syncthreads();
    {
      const int nxt = it + STAGES - 1;
      if (nxt < nk) {
        load_w(nxt % STAGES, kt_begin + nxt);
        load_x(nxt % STAGES, kt_begin + nxt);
      }
      detail::cp_async_commit();
    }
    const unsigned base = unsigned(it % STAGES) * kStageBytes;
    // GGUF: where each of this lane's weight rows' super-block starts in its slice (Q6_K: 0-14 bytes in).
    int slice_lo[RT], slice_hi[RT];
    if constexpr (WG) {
      const int kt = kt_begin + it;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int r0 = (wn * RT + rt) * 16 + g;
        auto start = [&](int r) {
          int in = 0;
          if constexpr (WF == WeightFormat::GgufQ6K)
            in = int((reinterpret_cast<uintptr_t>(w) + uint64_t(w_row(r)) * gguf_row_bytes +
                      uint64_t(kt) * gguf_block_bytes(WF)) & 15);
          return int(base) + r * gguf_slice_bytes(WF) + in;
        };
        slice_lo[rt] = start(r0);
        slice_hi[rt] = start(r0 + 8);
      }
    }
#pragma unroll
    for (int kg = 0; kg < KG; ++kg) {
      const int c = (wk * KG + kg) * 4 + t;  // this lane's chunk within the stage
      uint4 lo[RT], hi[RT];  // weight rows g and g + 8 of each 16-row tile
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int r0 = (wn * RT + rt) * 16 + g;
        if constexpr (WG) {  // k 8c .. 8c + 7 of rows r0 and r0 + 8's super-blocks
          lo[rt] = gguf_chunk_to<T, WF>(smem + slice_lo[rt], c);
          hi[rt] = gguf_chunk_to<T, WF>(smem + slice_hi[rt], c);
        } else if constexpr (W4) {  // the word c (k 8c .. 8c + 7) of rows r0 and r0 + 8, with their groups' zs
          // The group of this 32-k chunk (c >> 2) among the stage's zs words (gs 32, 64 or 128).
          const unsigned lg = many_groups ? unsigned((c >> 2) >> (gs_log2 - 5)) : 0u;
          const unsigned word = unsigned(c & 3) * 4, zs_at = base + int4_w_bytes(BK) + lg * 4;
          const uint32_t w_lo = *reinterpret_cast<const uint32_t*>(smem + base + swz4<BK>(r0, c >> 2) + word);
          const uint32_t w_hi = *reinterpret_cast<const uint32_t*>(smem + base + swz4<BK>(r0 + 8, c >> 2) + word);
          const uint32_t zs_lo = *reinterpret_cast<const uint32_t*>(smem + zs_at + r0 * kZsBytes);
          const uint32_t zs_hi = *reinterpret_cast<const uint32_t*>(smem + zs_at + (r0 + 8) * kZsBytes);
          lo[rt] = detail::int4x8_to<T>(w_lo, zs_lo);
          hi[rt] = detail::int4x8_to<T>(w_hi, zs_hi);
        } else if constexpr (W8) {  // the 8-byte piece c (k 8c .. 8c + 7) of rows r0 and r0 + 8
          const unsigned piece = unsigned(c & 1) * 8;
          lo[rt] = fp8x8_to<T>(*reinterpret_cast<const uint2*>(smem + base + swz8(r0, c >> 1) + piece));
          hi[rt] = fp8x8_to<T>(*reinterpret_cast<const uint2*>(smem + base + swz8(r0 + 8, c >> 1) + piece));
        } else {
          lo[rt] = lds128(smem, base + swz<CK>(r0, c));
          hi[rt] = lds128(smem, base + swz<CK>(r0 + 8, c));
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4 b = lds128(smem, base + kWBytes + swz<CK>(mt * 8 + g, c));  // token row g of tile mt
#pragma unroll
        for (int rt = 0; rt < RT; ++rt) {
          mma16816<T>(acc[kg % KA][rt][mt], lo[rt].x, hi[rt].x, lo[rt].y, hi[rt].y, b.x, b.y);
          mma16816<T>(acc[kg % KA][rt][mt], lo[rt].z, hi[rt].z, lo[rt].w, hi[rt].w, b.z, b.w);
        }
      }
    }
  }
  cp_async_wait_group<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: they become the reduction area
#pragma unroll
  for (int ka = 1; ka < KA; ++ka)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][rt][mt][i] += acc[ka][rt][mt][i];

  // acc[rt][mt] = {(row g, token 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)} of its 16 x 8 tile.
  float* red = reinterpret_cast<float*>(smem);  // [WK][XR][kRedStride]
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const int r0 = (wn * RT + rt) * 16 + g;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float* p = red + (wk * XR + mt * 8 + 2 * t) * kRedStride + r0;
      p[0] = acc[0][rt][mt][0];
      p[kRedStride] = acc[0][rt][mt][1];
      p[8] = acc[0][rt][mt][2];
      p[kRedStride + 8] = acc[0][rt][mt][3];
    }
  }
  __syncthreads();
  auto cta_sum = [&](int m, int r) {
    float v = red[m * kRedStride + r];
#pragma unroll
    for (int k = 1; k < WK; ++k) v += red[(k * XR + m) * kRedStride + r];
    return v;
  };

  bool summed = false;  // true: red[0] holds the finished sums (split-K), else cta_sum
  if (a.splits > 1) {
    __shared__ bool s_last;
    float* part = a.partials + int64_t(tile) * M * kBlockN;
    const int64_t split_stride = int64_t(a.tiles_n) * M * kBlockN;
    for (int i = tid; i < M * kBlockN; i += kThreads) __stcg(part + split * split_stride + i, cta_sum(i / kBlockN, i % kBlockN));
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(a.semaphores + tile, 1u) == unsigned(a.splits - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int i = tid; i < M * kBlockN; i += kThreads) {
      float v = 0.f;
      for (int s = 0; s < a.splits; ++s) v += __ldcg(part + s * split_stride + i);
      red[(i / kBlockN) * kRedStride + i % kBlockN] = v;
    }
    if (tid == 0) a.semaphores[tile] = 0u;  // every split has arrived: ready for the next launch
    __syncthreads();
    summed = true;
  }
  auto total = [&](int m, int r) { return summed ? red[m * kRedStride + r] : cta_sum(m, r); };

  const T* bias = static_cast<const T*>(a.bias);
  if (swiglu) {
    constexpr int half = kBlockN / 2;
    T* y = static_cast<T*>(a.y);
    for (int i = tid; i < M * half; i += kThreads) {
      const int m = i / half, j = i % half, f = tile * half + j;
      if (f >= F) continue;
      float gv = total(m, j), uv = total(m, half + j);
      if constexpr (W8) {
        gv *= a.w_scale[f];
        uv *= a.w_scale[F + f];
      }
      if (bias != nullptr) {
        gv += to_float(bias[f]);
        uv += to_float(bias[F + f]);
      }
      y[int64_t(m) * F + f] = from_float<T>(silu(gv) * uv);
    }
    return;
  }
  for (int i = tid; i < M * kBlockN; i += kThreads) {
    const int m = i / kBlockN, r = i % kBlockN, n = tile * kBlockN + r;
    if (n >= N) continue;
    float v = total(m, r);
    if constexpr (W8) v *= a.w_scale[n];
    if (bias != nullptr) v += to_float(bias[n]);
    const int64_t o = int64_t(m) * a.ldy + a.col0 + n;
    switch (a.epilogue) {
      case Epilogue::Store: static_cast<T*>(a.y)[o] = from_float<T>(v); break;
      case Epilogue::StoreF32: static_cast<float*>(a.y)[o] = v; break;
      default: static_cast<float*>(a.y)[o] += v; break;  // AddF32
    }
  }
}

template <class T, int MT, int S, WeightFormat WF>
void launch_kernel(const FlatGemmPlan& p, const Args& args, cudaStream_t stream) {
  auto* kernel = flat_gemm_kernel<T, MT, S, WF>;
  // Raising the dynamic shared-memory limit is a per-kernel attribute of the current device: done
  // once per instantiation and device (per_device.h), not per launch, so launches stay capturable
  // in CUDA graphs. The carveout preference asks for the largest shared-memory share of L1
  // (228 KB), which the 2-3 resident CTAs per SM of the plan assume.
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem_bytes_for(MT, S, WF))),
                       "flat_gemm: cudaFuncSetAttribute");
    detail::cuda_check(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)),
        "flat_gemm: cudaFuncSetAttribute");
  });
  // Split-K launches stay ordinary unless the options say otherwise (kernel_options.h has the
  // measurement).
  const KernelOptions& o = current_kernel_options();
  const bool programmatic = o.linear_programmatic() && (p.splits == 1 || o.split_k_programmatic_launch);
  const detail::LaunchConfig config(dim3(unsigned(p.tiles_n), unsigned(p.splits)), dim3(kThreads), p.smem_bytes, stream,
                                    programmatic);
  detail::cuda_check(cudaLaunchKernelEx(config.get(), kernel, args), "cudaLaunchKernelEx(flat_gemm)");
}

template <class T, int MT, WeightFormat WF>
void launch_mt(const FlatGemmPlan& p, const Args& args, cudaStream_t stream) {
  if constexpr (MT == 8) {
    launch_kernel<T, MT, 3, WF>(p, args, stream);  // 3 stages only: see flat_gemm_plan
  } else {
    switch (p.stages) {
      case 3: return launch_kernel<T, MT, 3, WF>(p, args, stream);
      case 4: return launch_kernel<T, MT, 4, WF>(p, args, stream);
      default: return launch_kernel<T, MT, 6, WF>(p, args, stream);
    }
  }
}

template <class T, WeightFormat WF>
void launch_weights(const FlatGemmPlan& p, const Args& args, cudaStream_t stream) {
  switch (p.m_tiles) {
    case 1: return launch_mt<T, 1, WF>(p, args, stream);
    case 2: return launch_mt<T, 2, WF>(p, args, stream);
    case 4: return launch_mt<T, 4, WF>(p, args, stream);
    default: return launch_mt<T, 8, WF>(p, args, stream);
  }
}

}  // namespace

bool programmatic_launch_enabled() { return current_kernel_options().programmatic_launch; }

bool linear_programmatic_launch_enabled() { return current_kernel_options().linear_programmatic(); }

// Planning. tiles_n = ceil(N / 64) CTAs along N (SwiGLU: ceil(F / 32) with F = N / 2, the same
// number for even N), so the plan does not depend on the epilogue.
//
// Split-K: a CTA streams 16 KB per stage with 2-3 stages in flight; to keep HBM busy every SM needs
// CTAs, and a tile count below ~2 per SM leaves bandwidth unused. So where tiles_n < SMs, the split
// count s maximizes
//     min(1, tiles_n * s / (2 * SMs))          (two CTAs per SM reach full bandwidth)
//   * (k_tiles / s) / ceil(k_tiles / s)        (the longest split sets the time: balance them)
//   * (1 - 0.01 * s)                           (each split writes and re-reads an fp32 partial)
// with tiles_n * s within one resident wave (SMs * ctas_per_sm) and every split streaming at least
// kMinKTiles * 128 of K. Worked numbers on the H200 (132 SMs, m_tiles 1: 3 CTAs per SM):
//   O [4096, 4096]: 64 tiles, 32 k-tiles: s = 4 -> 0.97 * 1.00 * 0.96 = 0.93; s = 5 -> 1.00 * 0.91 *
//     0.95 = 0.87; s = 6 -> 0.84: 4 splits, 256 CTAs of 8 k-tiles (1 MB of partials at M = 16).
//   down [4096, 11008]: 64 tiles, 86 k-tiles: s = 4 -> 0.97 * 0.98 * 0.96 = 0.910, s = 5 -> 0.908: 4.
//   Llama-3 QKV [6144, 4096]: 96 tiles: s = 4 (cap 396 / 96) -> 1.00 * 1.00 * 0.96 = 0.96 (s = 3: 0.94).
//   [16, 4096] (one tile): s = 8 (the k-tile cap 32 / 4): 8 CTAs instead of 1.
//   QKV [12288, 4096] (192 tiles), gate+up [22016, 4096] (344): >= 132 tiles, no split.
FlatGemmPlan flat_gemm_plan(int M, int N, int K, int multiprocessors, int splits, int stages, WeightFormat format) {
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(N >= 1 && K >= 1, "flat_gemm: N = {}, K = {} must be positive", N, K);
  check(multiprocessors >= 1, "flat_gemm: multiprocessors = {} must be positive", multiprocessors);
  constexpr int kMinKTiles = 4;
  FlatGemmPlan p;
  p.m_tiles = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
  p.stages = stages > 0 ? stages : default_stages(p.m_tiles, format);
  check(p.stages == 3 || p.stages == 4 || p.stages == 6, "flat_gemm: stages = {} (compiled: 3, 4, 6)", p.stages);
  // m_tiles 8 is compiled with 3 stages only: its 4-stage build (128 registers with a small spill
  // under __launch_bounds__(256, 2)) stopped with "illegal instruction" on the H200 (run 2 of
  // flat_gemm; cause not found yet), while 3 stages passed every test.
  check(p.m_tiles != 8 || p.stages == 3, "flat_gemm: M = {} (m_tiles 8) is compiled with 3 stages only, not {}", M,
        p.stages);
  p.block_n = kBlockN;
  p.block_k = block_k_for(format, p.m_tiles);
  p.tiles_n = (N + kBlockN - 1) / kBlockN;
  p.k_tiles = (K + p.block_k - 1) / p.block_k;
  p.smem_bytes = smem_bytes_for(p.m_tiles, p.stages, format);
  p.ctas_per_sm = std::max<int>(1, int(std::min<size_t>(8, kSmemPerSm / (p.smem_bytes + kSmemReservedPerCta))));
  if (splits > 0) {
    p.splits = std::clamp(splits, 1, p.k_tiles);
  } else if (p.tiles_n < multiprocessors) {
    const int slots = multiprocessors * p.ctas_per_sm;
    const int cap = std::max(1, std::min(slots / p.tiles_n, p.k_tiles / kMinKTiles));
    double best = -1;
    for (int s = 1; s <= cap; ++s) {
      const double par = std::min(1.0, double(p.tiles_n) * s / (2.0 * multiprocessors));
      const double bal = (double(p.k_tiles) / s) / ((p.k_tiles + s - 1) / s);
      const double score = par * bal * (1.0 - 0.01 * s);
      if (score > best) {
        best = score;
        p.splits = s;
      }
    }
  }
  if (p.splits > 1) {
    check(p.tiles_n <= kSemaphores, "flat_gemm: {} tiles with split-K exceed the {} semaphores", p.tiles_n,
          kSemaphores);
    p.workspace_bytes = kSemaphoreBytes + size_t(p.splits) * p.tiles_n * M * kBlockN * sizeof(float);
  }
  return p;
}

size_t flat_gemm_workspace_bytes(int M, int N, int K, int multiprocessors, WeightFormat format) {
  return flat_gemm_plan(M, N, K, multiprocessors, 0, 0, format).workspace_bytes;
}

size_t flat_gemm_workspace_bound(int max_m, int multiprocessors, WeightFormat format) {
  check(max_m >= 1 && multiprocessors >= 1, "flat_gemm_workspace_bound: max_m = {}, multiprocessors = {}", max_m,
        multiprocessors);
  size_t bound = 0;
  for (int m = 1; m <= std::min(max_m, kFlatGemmMaxM); ++m) {
    // A plan with no split (N of one wave or more) tells this M's CTAs per SM; a split plan's
    // tiles_n * splits is at most that many slots.
    const FlatGemmPlan p = flat_gemm_plan(m, kBlockN * multiprocessors, kBlockKGguf, multiprocessors, 0, 0, format);
    const size_t slots = size_t(multiprocessors) * size_t(p.ctas_per_sm);
    bound = std::max(bound, kSemaphoreBytes + slots * size_t(m) * kBlockN * sizeof(float));
  }
  return bound;
}

namespace {
// The weights' extra parts by format: FP8's row scales, 4-bit's zs words and group size; and where
// y's columns go (a GGUF segment's, inside a wider y).
struct WeightParts {
  WeightFormat format = WeightFormat::Bits16;
  const float* w_scale = nullptr;
  const uint32_t* zs = nullptr;
  int group_size = 0, zs_stride = 0;
  int ldy = 0, col0 = 0;  // 0: y is [M, N]
};

void run_flat_gemm(const FlatGemmPlan& plan, const void* x, const void* w, const WeightParts& parts, const void* bias,
                   void* y, int M, int N, int K, DType dtype, Epilogue epilogue, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
  check(x != nullptr && w != nullptr && y != nullptr, "flat_gemm: null pointer (x {}, w {}, y {})", x, w, y);
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(N >= 1 && K >= 1, "flat_gemm: N = {}, K = {} must be positive", N, K);
  const WeightFormat format = parts.format;
  const int k_multiple = is_gguf(format)                ? kBlockKGguf
                         : format == WeightFormat::Int4 ? 32
                         : format == WeightFormat::Fp8  ? 16
                                                        : 8;
  check(K % k_multiple == 0, "flat_gemm: K = {} is not a multiple of {} (rows are streamed in 16-byte chunks)", K,
        k_multiple);
  check(detail::aligned16(x) && detail::aligned16(w), "flat_gemm: x ({}) and w ({}) must be 16-byte aligned", x, w);
  check(epilogue != Epilogue::SwiGLU || N % 2 == 0, "flat_gemm: SwiGLU needs an even N ([gate; up]), got N = {}", N);
  check(dtype == DType::F16 || dtype == DType::BF16, "flat_gemm: unknown dtype {}", static_cast<int>(dtype));
  const int need_mt = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
  check(plan.m_tiles == need_mt && plan.block_k == block_k_for(format, plan.m_tiles) &&
            plan.k_tiles == (K + plan.block_k - 1) / plan.block_k &&
            plan.tiles_n == (N + kBlockN - 1) / kBlockN && plan.splits >= 1 && plan.splits <= plan.k_tiles,
        "flat_gemm: plan (m_tiles {}, tiles_n {}, k_tiles {}, splits {}) does not fit M = {}, N = {}, K = {}",
        plan.m_tiles, plan.tiles_n, plan.k_tiles, plan.splits, M, N, K);
  check(plan.smem_bytes == smem_bytes_for(plan.m_tiles, plan.stages, format),
        "flat_gemm: the plan was made for other weights than these");
  Args args{x,           w,        bias,          y,       M,          N,
            K,           plan.tiles_n, plan.splits, plan.k_tiles, epilogue, nullptr,
            nullptr,     parts.w_scale, parts.zs,  parts.group_size, parts.zs_stride,
            parts.ldy > 0 ? parts.ldy : N, parts.col0};
  if (plan.splits > 1) {
    check(workspace != nullptr && workspace_bytes >= plan.workspace_bytes,
          "flat_gemm: split-K ({} splits) needs {} bytes of zeroed workspace, got {} at {}", plan.splits,
          plan.workspace_bytes, workspace_bytes, workspace);
    check(detail::aligned16(workspace), "flat_gemm: workspace {} must be 16-byte aligned", workspace);
    args.semaphores = static_cast<unsigned*>(workspace);
    args.partials = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + kSemaphoreBytes);
  }
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (format) {
      case WeightFormat::Fp8: return launch_weights<T, WeightFormat::Fp8>(plan, args, stream);
      case WeightFormat::Int4: return launch_weights<T, WeightFormat::Int4>(plan, args, stream);
      case WeightFormat::GgufQ4K: return launch_weights<T, WeightFormat::GgufQ4K>(plan, args, stream);
      case WeightFormat::GgufQ6K: return launch_weights<T, WeightFormat::GgufQ6K>(plan, args, stream);
      case WeightFormat::GgufQ5K: return launch_weights<T, WeightFormat::GgufQ5K>(plan, args, stream);
      case WeightFormat::GgufQ4_0: return launch_weights<T, WeightFormat::GgufQ4_0>(plan, args, stream);
      case WeightFormat::GgufQ4_1: return launch_weights<T, WeightFormat::GgufQ4_1>(plan, args, stream);
      case WeightFormat::GgufQ8_0: return launch_weights<T, WeightFormat::GgufQ8_0>(plan, args, stream);
      default: return launch_weights<T, WeightFormat::Bits16>(plan, args, stream);
    }
  });
  check_launch("flat_gemm");
}
}  // namespace

void flat_gemm(const FlatGemmPlan& plan, const void* x, const void* w, const void* bias, void* y, int M, int N, int K,
               DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  run_flat_gemm(plan, x, w, WeightParts{}, bias, y, M, N, K, dtype, epilogue, workspace, workspace_bytes, stream);
}

void flat_gemm_fp8(const void* x, const uint8_t* w8, const float* w_scale, const void* bias, void* y, int M, int N,
                   int K, DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) {
  check(w_scale != nullptr, "flat_gemm_fp8: no row scales");
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm_fp8: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(K % 16 == 0, "flat_gemm_fp8: K = {} is not a multiple of 16", K);
  const FlatGemmPlan plan = flat_gemm_plan(M, N, K, multiprocessors_of_current_device(), 0, 0, WeightFormat::Fp8);
  WeightParts parts;
  parts.format = WeightFormat::Fp8;
  parts.w_scale = w_scale;
  run_flat_gemm(plan, x, w8, parts, bias, y, M, N, K, dtype, epilogue, workspace, workspace_bytes, stream);
}

void flat_gemm_int4(const void* x, const uint32_t* q4, const uint32_t* zs, int group_size, int zs_stride,
                    const void* bias, void* y, int M, int N, int K, DType dtype, Epilogue epilogue, void* workspace,
                    size_t workspace_bytes, cudaStream_t stream) {
  check(zs != nullptr, "flat_gemm_int4: no zs words");
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm_int4: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(K % 32 == 0, "flat_gemm_int4: K = {} is not a multiple of 32", K);
  check(int4_group_problem(K, group_size) == nullptr, "flat_gemm_int4: group size {} with K = {}: {}", group_size, K,
        int4_group_problem(K, group_size));
  check(zs_stride == int4_zs_stride(K, group_size), "flat_gemm_int4: zs stride {} (int4.h's is {})", zs_stride,
        int4_zs_stride(K, group_size));
  const FlatGemmPlan plan = flat_gemm_plan(M, N, K, multiprocessors_of_current_device(), 0, 0, WeightFormat::Int4);
  WeightParts parts;
  parts.format = WeightFormat::Int4;
  parts.zs = zs;
  parts.group_size = group_size;
  parts.zs_stride = zs_stride;
  run_flat_gemm(plan, x, q4, parts, bias, y, M, N, K, dtype, epilogue, workspace, workspace_bytes, stream);
}

bool flat_gemm_gguf_format(uint32_t ggml_type, WeightFormat& format) {
  for (const GgufFormatType& t : kGgufFormatTypes)
    if (t.ggml_type == ggml_type) {
      format = t.format;
      return true;
    }
  return false;
}

void flat_gemm_gguf(const void* x, uint32_t ggml_type, const void* w, const void* bias, void* y, int M, int N, int K,
                    int ldy, int col0, DType dtype, Epilogue epilogue, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream) {
  WeightParts parts;
  check(flat_gemm_gguf_format(ggml_type, parts.format), "flat_gemm_gguf: no flat GEMM for ggml type {}", ggml_type);
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm_gguf: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(K % kBlockKGguf == 0, "flat_gemm_gguf: K = {} is not a multiple of {}", K, kBlockKGguf);
  check(epilogue == Epilogue::SwiGLU || (ldy >= N && col0 >= 0 && col0 <= ldy - N),
        "flat_gemm_gguf: columns [{}, {}) of rows of {}", col0, col0 + N, ldy);
  parts.ldy = epilogue == Epilogue::SwiGLU ? 0 : ldy;
  parts.col0 = epilogue == Epilogue::SwiGLU ? 0 : col0;
  const FlatGemmPlan plan = flat_gemm_plan(M, N, K, multiprocessors_of_current_device(), 0, 0, parts.format);
  run_flat_gemm(plan, x, w, parts, bias, y, M, N, K, dtype, epilogue, workspace, workspace_bytes, stream);
}

void flat_gemm(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype,
               Epilogue epilogue, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check(M >= 1 && M <= kFlatGemmMaxM, "flat_gemm: M = {} out of range [1, {}]", M, kFlatGemmMaxM);
  check(K % 8 == 0, "flat_gemm: K = {} is not a multiple of 8 (rows are streamed in 16-byte chunks)", K);
  const FlatGemmPlan plan = flat_gemm_plan(M, N, K, multiprocessors_of_current_device());
  flat_gemm(plan, x, w, bias, y, M, N, K, dtype, epilogue, workspace, workspace_bytes, stream);
}

}  // namespace fdpp::cuda
