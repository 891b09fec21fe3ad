// Hopper warpgroup MMA (wgmma, sm_90a) primitives: shared-memory matrix descriptors over the
// 128-byte-swizzled layout, the two products the prefill attention needs, and the fences around
// them, and the warp-specialization primitives (mbarriers, TMA loads, named barriers, setmaxnreg)
// of the producer/consumer kernel. A warpgroup is 4 consecutive warps (128 threads); every thread of it
// calls each wgmma function here together. Private: .cu files only; callers compile the bodies only
// for sm_90a (FDPP_WGMMA_DEVICE below) and launch them only where the device runs them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// True in device code compiled for sm_90a (the 'a' target carries wgmma).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FDPP_WGMMA_DEVICE 1
#else
#define FDPP_WGMMA_DEVICE 0
#endif

namespace fdpp::cuda::detail {

// The 128-byte swizzle (CUTLASS's Swizzle<3,4,3>): a tile is stored in atoms of 8 rows x 128 bytes
// (1 KB, 1 KB-aligned), and 16-byte chunk c of row r sits at chunk c ^ (r & 7) of its row. A row
// of 64 16-bit elements is one atom row; wider rows are split into 64-element column blocks, each
// a [rows][64] tile of its own (sw128_offset).

// Byte offset of 16-byte chunk c (8 elements) of row r in a [rows][cols] 16-bit tile stored as
// cols / 64 column blocks of [rows][64] swizzled atoms.
__host__ __device__ __forceinline__ uint32_t sw128_offset(int rows, int r, int c) {
  return uint32_t((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Shared-memory descriptor of an operand in 128-byte-swizzled atoms, starting at byte address
// `addr` (shared window). Both the leading and the stride byte offsets are set to 1 KB, the
// distance between consecutive 8-row atoms along the operand's strided dimension: for K-major
// operands the hardware reads only the stride offset, for MN-major ones whose MN extent is one
// 64-element atom (the only kind used here) the leading offset is unused; either way the 1 KB
// lands where it is read.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  constexpr uint64_t kAtomStride = 1024 >> 4;  // in 16-byte units
  return uint64_t((addr & 0x3FFFF) >> 4) | (kAtomStride << 16) | (kAtomStride << 32) | (uint64_t(1) << 62);
}

// Orders this thread's register writes (accumulators, A fragments) before the wgmma that follows.
__device__ __forceinline__ void wgmma_fence() {
#if FDPP_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if FDPP_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if FDPP_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if FDPP_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Pins registers an in-flight wgmma writes: the compiler may not move their reads or writes across
// this point (used after issuing and after waiting).
template <int N>
__device__ __forceinline__ void wgmma_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands of the m64n64 (32 fp32 registers per thread) and m64n128 (64) shapes,
// spelled once for every dtype's asm below.
#define FDPP_WGMMA_D32(d)                                                                                     \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FDPP_WGMMA_D64(d)                                                                                       \
  FDPP_WGMMA_D32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
      "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),   \
      "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),   \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),   \
      "+f"(d[63])

// d (64 x 128 fp32, the m64n128 accumulator layout) (+)= A (64 x 16, K-major, shared) . B (16 x 128,
// K-major: 128 rows of 16 contiguous k, shared). accumulate = false overwrites d. AB is the PTX
// type of A and B ("f16", "bf16").
#define FDPP_WGMMA_M64N128K16_SS(AB)                                                     \
  asm volatile(                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                       \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." AB "." AB                           \
      " {"                                                                               \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"   \
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                 \
      : FDPP_WGMMA_D64(d)                                                                \
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)))

template <class T>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#if FDPP_WGMMA_DEVICE
  if constexpr (std::is_same_v<T, __half>) {
    FDPP_WGMMA_M64N128K16_SS("f16");
  } else {
    FDPP_WGMMA_M64N128K16_SS("bf16");
  }
#endif
}

// d (64 x 64 fp32) (+)= A (64 x 16 in registers: the mma.sync m16n8k16 A fragment of each warp's 16
// rows) . B (16 x 64, MN-major: 16 rows of 64 contiguous n, shared).
#define FDPP_WGMMA_M64N64K16_RS(AB)                                                    \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB                          \
      " {"                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "         \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                 \
      : FDPP_WGMMA_D32(d)                                                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))

template <class T>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                   bool accumulate) {
#if FDPP_WGMMA_DEVICE
  if constexpr (std::is_same_v<T, __half>) {
    FDPP_WGMMA_M64N64K16_RS("f16");
  } else {
    FDPP_WGMMA_M64N64K16_RS("bf16");
  }
#endif
}

#undef FDPP_WGMMA_M64N64K16_RS
#undef FDPP_WGMMA_M64N128K16_SS
#undef FDPP_WGMMA_D64
#undef FDPP_WGMMA_D32

// ---- warp specialization (sm_90a): mbarriers, cp.async completion on an mbarrier, TMA, named
// barriers, register reallocation. Shared addresses are 32-bit shared-window addresses (smem_addr).

// An mbarrier of `count` arrivals per phase. Initialized by one thread; mbarrier_init_fence() and a
// CTA barrier before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if FDPP_WGMMA_DEVICE
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_init_fence() {
#if FDPP_WGMMA_DEVICE
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Waits until the phase of parity `parity` (0 or 1) has completed (acquire: the writes released by
// its arrivals are visible after). A fresh barrier is in phase 0, so waiting on parity 1 returns at
// once ("the phase before the first" counts as complete): producers wait on their empty barriers
// with the parity flipped.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if FDPP_WGMMA_DEVICE
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
#endif
}
// One arrival (release: this thread's earlier memory accesses happen before the phase completes).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if FDPP_WGMMA_DEVICE
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// One arrival once every cp.async this thread has issued so far has landed; .noinc: the barrier's
// expected count must include it (one per issuing thread and phase).
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
#if FDPP_WGMMA_DEVICE
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// 16 bytes global -> shared (.cg), or 16 zero bytes where !valid (src-size 0: nothing is read, and
// the zeros are written by the copy itself, so they complete, and are tracked, like a copy).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
#if FDPP_WGMMA_DEVICE
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#endif
}
// ---- TMA (cp.async.bulk.tensor) into an mbarrier's transaction count. `tmap`: the generic address
// of a CUtensorMap in kernel parameter space (a const __grid_constant__ parameter) or global memory.

// One arrival that also raises the phase's expected transaction count by `bytes`: the phase then
// completes once its arrivals are in and that many bytes of async copies have landed (complete_tx).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FDPP_WGMMA_DEVICE
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Box (c0, c1, c2, c3) of a 4D tensor map into shared memory at `dst` (the map's swizzle applied on
// the shared address bits: 128-byte swizzle needs dst 1 KB aligned for sw128_offset's layout), its
// bytes counted off `bar`'s transaction count as they land.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* tmap, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
#if FDPP_WGMMA_DEVICE
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}
// Brings a tensor map into the TMA unit's descriptor cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensormap(const void* tmap) {
#if FDPP_WGMMA_DEVICE
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
#endif
}

// Named barriers (id 1..15; 0 is __syncthreads): `threads` in all, a multiple of 32. sync waits for
// them, arrive counts this warp without waiting. Not .aligned (bar.sync is): the producer and the
// consumers reach one barrier at different instructions, which .aligned forbids (synccheck).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
#if FDPP_WGMMA_DEVICE
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
#if FDPP_WGMMA_DEVICE
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
// The calling warpgroup's registers per thread, lowered or raised (a multiple of 8 in 24..256;
// every warp of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg");
#if FDPP_WGMMA_DEVICE
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg");
#if FDPP_WGMMA_DEVICE
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace fdpp::cuda::detail
