// Decode attention over the paged KV cache (kernels.h: decode_attention, decode_attention_async):
// the kernels' instantiations and their launches. The parts, all of this one translation unit:
//   decode_plan.h                  host-only plan: CTA shapes, loop and warps, CTA groups, split count
//   decode_attention_common.cuh    the kernel's arguments, the row slice, staged rows, K/V copies
//   decode_attention_core.cuh      the CUDA-core loop (one query head per CTA)
//   decode_attention_mma.cuh       the tensor-core loop (the query group as the mma's M = 16 rows)
//   decode_attention_kernel.cuh    one CTA's work: prologue, loop, merge of the warps, async reduction
//   softmax_state.cuh              the {m, d, o} state the merges and combines add
//   decode_attention_combine.cuh   the combine launches of split rows (synchronized, unified max)
// The design and every measurement behind it: docs/kernels/decode_attention.md.
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/decode_attention_combine.cuh"
#include "backend/cuda/decode_attention_common.cuh"
#include "backend/cuda/decode_attention_kernel.cuh"
#include "backend/cuda/decode_plan.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_cache_layout.h"
#include "backend/cuda/per_device.h"

namespace fdpp::cuda {

namespace {

using decode::with_head_dim;

// The head dims with e4m3-cache kernels.
template <int D>
constexpr bool kFp8HeadDim = D == 64 || D == 128 || D == 256;

template <class T, int D, int GMAX, bool kAsync, bool kMma, int W, bool kKernelCombine, bool kMasked = false,
          bool kFp8 = false>
void launch_decode(const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  using Shape = typename ShapeOf<D, GMAX, kMma, W, kFp8>::type;
  constexpr size_t smem = Shape::kSmem + kFlagBytes;
  static_assert(Shape::kSmem % 16 == 0 && smem <= 227 * 1024, "shared memory layout");
  auto* kernel = decode_attention_kernel<T, D, GMAX, kAsync, kMma, W, kKernelCombine, kMasked, kFp8>;
  // Once per (instantiation, device), before any graph capture uses it: the attribute belongs to
  // the current device, and one process drives several under tensor parallelism.
  once_per_device(reinterpret_cast<const void*>(kernel), [&] {
    if (smem > 48 * 1024)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                 "cudaFuncSetAttribute(decode_attention_kernel, max dynamic shared memory)");
    // Several CTAs per SM need the whole shared-memory carveout (the driver may otherwise pick a
    // smaller one and fit fewer CTAs).
    if (min_ctas_per_sm<D, GMAX, kMma, W, kFp8>() > 1)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared),
                 "cudaFuncSetAttribute(decode_attention_kernel, shared memory carveout)");
  });
  const detail::LaunchConfig config(dim3(a.n_groups, a.splits), dim3(Shape::kWarps * 32), smem, stream, dependent);
  cuda_check(cudaLaunchKernelEx(config.get(), kernel, a), "cudaLaunchKernelEx(decode_attention_kernel)");
}

template <class T, int D, bool kAsync, int W>
void launch_decode_gw(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  if (c.tensor_cores) {
    if constexpr (kAsync) {
      if (c.combine_in_kernel) return launch_decode<T, D, 16, true, true, W, true>(a, dependent, stream);
    }
    return launch_decode<T, D, 16, kAsync, true, W, false>(a, dependent, stream);
  }
  // (The async mode never gets here: the CUDA-core loop runs synchronized only; decode_attention_async.)
  if constexpr (!kAsync && (D == 64 || D == 128)) {
    switch (a.gmax) {
      case 1: return launch_decode<T, D, 1, false, false, W, false>(a, dependent, stream);
      case 2: return launch_decode<T, D, 2, false, false, W, false>(a, dependent, stream);
      case 4: return launch_decode<T, D, 4, false, false, W, false>(a, dependent, stream);
      case 8: return launch_decode<T, D, 8, false, false, W, false>(a, dependent, stream);
      default: return launch_decode<T, D, 16, false, false, W, false>(a, dependent, stream);
    }
  }
  check(false, "decode attention: no CUDA-core kernel at head_dim {} (async {})", D, kAsync);
}

template <class T, int D, bool kAsync>
void launch_decode_g(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  if constexpr (D == 64 || D == 128) {
    if (c.warps == 4) return launch_decode_gw<T, D, kAsync, 4>(c, a, dependent, stream);
    return launch_decode_gw<T, D, kAsync, 8>(c, a, dependent, stream);
  } else {
    return launch_decode_gw<T, D, kAsync, default_warps<D>()>(c, a, dependent, stream);
  }
}

// A masked call (window or soft-cap) or one over an e4m3 cache: the tensor-core loop at the head
// dim's default warps only (describe_launch's tensor-core-only plan), one instantiation each.
template <class T, int D, bool kAsync, bool kMasked, bool kFp8>
void launch_decode_tc(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool dependent, cudaStream_t stream) {
  constexpr int W = default_warps<D>();
  check(c.tensor_cores && c.warps == W, "decode attention: a {} call planned on {} with {} warps",
        kFp8 ? "e4m3-cache" : "masked", c.tensor_cores ? "tensor cores" : "CUDA cores", c.warps);
  if constexpr (kFp8 && !kFp8HeadDim<D>) {
    check(false, "decode attention: no e4m3-cache kernel at head_dim {}", D);
  } else {
    if constexpr (kAsync) {
      if (c.combine_in_kernel) return launch_decode<T, D, 16, true, true, W, true, kMasked, kFp8>(a, dependent, stream);
    }
    return launch_decode<T, D, 16, kAsync, true, W, false, kMasked, kFp8>(a, dependent, stream);
  }
}

// Masked calls (DecodeAttentionParams::window or softcap) take their own kernels.
bool masked(const DecodeArgs& a) { return a.window > 0 || a.softcap > 0.f; }

// The main kernels of a call: by mask and cache type.
template <class T, int D, bool kAsync>
void launch_decode_main(const DecodeAttentionLaunch& c, const DecodeArgs& a, bool fp8, bool dependent,
                        cudaStream_t stream) {
  if (fp8) {
    if (masked(a)) return launch_decode_tc<T, D, kAsync, true, true>(c, a, dependent, stream);
    return launch_decode_tc<T, D, kAsync, false, true>(c, a, dependent, stream);
  }
  if (masked(a)) return launch_decode_tc<T, D, kAsync, true, false>(c, a, dependent, stream);
  return launch_decode_g<T, D, kAsync>(c, a, dependent, stream);
}

// A call: the kernel's arguments and how it launches.
struct Call {
  DecodeArgs args;
  DecodeAttentionLaunch launch;
};

// Checks the arguments shared by both modes, fills the kernel's arguments and chooses the launch.
Call make_call(const DecodeAttentionParams& p, bool async_mode) {
  const int splits = p.splits, batch = p.batch, n_heads = p.n_heads, n_kv_heads = p.n_kv_heads, head_dim = p.head_dim;
  check(splits >= 1 && splits <= decode::kMaxSplits, "decode_attention: splits = {} out of range [1, {}]", splits,
        decode::kMaxSplits);
  check(p.qkv != nullptr && p.k_cache != nullptr && p.v_cache != nullptr && p.block_tables != nullptr &&
            p.context_lens != nullptr && p.out != nullptr,
        "decode_attention: null pointer (qkv {}, k_cache {}, v_cache {}, block_tables {}, context_lens {}, out {})",
        p.qkv, p.k_cache, p.v_cache, static_cast<const void*>(p.block_tables),
        static_cast<const void*>(p.context_lens), p.out);
  check(batch > 0 && n_heads > 0 && n_kv_heads > 0 && p.max_blocks_per_seq > 0,
        "decode_attention: batch = {}, n_heads = {}, n_kv_heads = {}, max_blocks_per_seq = {} must be positive",
        batch, n_heads, n_kv_heads, p.max_blocks_per_seq);
  check(n_heads % n_kv_heads == 0, "decode_attention: n_heads = {} is not a multiple of n_kv_heads = {}", n_heads,
        n_kv_heads);
  check(head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256,
        "decode_attention: head_dim = {} is not supported (64, 80, 96, 128, 256)", head_dim);
  check(std::isfinite(p.scale), "decode_attention: scale = {} is not finite", p.scale);
  check(p.window >= 0 && std::isfinite(p.softcap) && p.softcap >= 0.f &&
            (p.softcap == 0.f || (p.scale > 0.f && std::isfinite(p.softcap / p.scale))),
        "decode_attention: window = {}, softcap = {} (scale {}) out of range", p.window, p.softcap, p.scale);
  check(aligned16(p.k_cache) && aligned16(p.v_cache), "decode_attention: k/v cache pointers must be 16-byte aligned");
  check(p.dtype == DType::F16 || p.dtype == DType::BF16, "decode_attention: unknown dtype {}",
        static_cast<int>(p.dtype));
  check_kv_quant(p.kv_quant, head_dim, "decode_attention");
  const bool fp8 = p.kv_quant.dtype == KvDType::Fp8E4M3;
  const int multiprocessors = multiprocessors_of_current_device();
  const decode::GroupPlan g = decode::plan_groups(batch, n_heads, n_kv_heads, splits, multiprocessors);
  check(g.n_groups <= 0x7fffffff, "decode_attention: {} CTAs exceed the grid limit", g.n_groups);
  DecodeArgs a{};
  a.qkv = p.qkv;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.context_lens = p.context_lens;
  a.batch = batch;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.group = g.group;
  a.n_sub = g.n_sub;
  a.gmax = g.gmax;
  a.n_groups = static_cast<int>(g.n_groups);
  // An e4m3 row of head_dim bytes is addressed as head_dim / 2 16-bit units (MmaShape::kStagedDim),
  // and K's scale multiplies every logit.
  const float scale = fp8 ? p.scale * p.kv_quant.k_scale : p.scale;
  a.kv = kv_cache_layout(p.block_size, n_kv_heads, fp8 ? head_dim / 2 : head_dim, "decode_attention");
  a.scale_log2 = scale * detail::kLog2e;
  a.out = p.out;
  a.splits = splits;
  a.window = p.window;
  a.softcap = p.softcap;
  a.scale = scale;
  a.v_scale = fp8 ? p.kv_quant.v_scale : 1.f;
  return {a, decode::describe_launch(g, batch, n_heads, n_kv_heads, head_dim, splits, p.max_context_len, async_mode,
                                     multiprocessors, masked(a) || fp8)};
}

// Calls f(Shape{}) with the CombineShape of the launch describe_launch chose.
template <class F>
void with_combine_shape(CombineLaunch combine, F&& f) {
  switch (combine) {
    case CombineLaunch::FewRows: return f(CombineFewRows{});
    case CombineLaunch::SomeRows: return f(CombineSomeRows{});
    case CombineLaunch::ManyRows: return f(CombineManyRows{});
    case CombineLaunch::None: break;
  }
  check(false, "decode_attention: the launch has several splits but no combine shape");
}

// The synchronized kernels (and their combine when a.splits > 1) for arguments make_call filled;
// a.partials holds decode_attention_workspace_bytes when there are several splits.
void launch_synchronized(const DecodeArgs& a, const DecodeAttentionLaunch& c, int head_dim, DType dtype, bool fp8,
                         cudaStream_t stream) {
  const int splits = a.splits;
  detail::dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = programmatic_launch_enabled();
    with_head_dim(head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      launch_decode_main<T, D, false>(c, a, fp8, pdl, stream);
      if (splits == 1) return;
      with_combine_shape(c.combine, [&](auto shape) {
        using Shape = decltype(shape);
        const detail::LaunchConfig config(dim3(a.batch * a.n_heads), dim3(Shape::kThreads), 0, stream, pdl);
        cuda_check(cudaLaunchKernelEx(config.get(), decode_combine_kernel<T, D, Shape>,
                                      static_cast<const float*>(a.partials), splits, static_cast<T*>(a.out)),
                   "cudaLaunchKernelEx(decode_combine_kernel)");
      });
    });
  });
  check_launch("decode_attention");
}

}  // namespace

void decode_attention(const DecodeAttentionParams& p, cudaStream_t stream) {
  Call call = make_call(p, false);
  const size_t need = decode_attention_workspace_bytes(p.batch, p.n_heads, p.head_dim, p.splits);
  check(p.splits == 1 || (p.workspace != nullptr && p.workspace_bytes >= need),
        "decode_attention: {} splits need {} bytes of workspace, got {}", p.splits, need, p.workspace_bytes);
  call.args.partials = static_cast<float*>(p.workspace);
  launch_synchronized(call.args, call.launch, p.head_dim, p.dtype, p.kv_quant.dtype == KvDType::Fp8E4M3, stream);
}

void decode_attention_async(const DecodeAttentionParams& p, cudaStream_t stream) {
  Call call = make_call(p, true);
  DecodeArgs& a = call.args;
  const DecodeAttentionLaunch& c = call.launch;
  const UnifiedMaxRange& range = p.range;
  const bool fp8 = p.kv_quant.dtype == KvDType::Fp8E4M3;
  check(std::isfinite(range.phi) && std::isfinite(range.a) && std::isfinite(range.b) && range.a < range.b,
        "decode_attention_async: unified max phi = {}, range [{}, {}] is not a finite, non-empty interval", range.phi,
        range.a, range.b);
  const size_t need_bytes =
      decode_attention_async_workspace_bytes(p.batch, p.n_heads, p.n_kv_heads, p.head_dim, p.splits);
  check(p.workspace != nullptr && p.workspace_bytes >= need_bytes && aligned16(p.workspace),
        "decode_attention_async: needs {} bytes of 16-byte aligned workspace, got {} at {}", need_bytes,
        p.workspace_bytes, p.workspace);
  const int need_counters = decode_attention_async_counters(p.batch, p.n_heads, p.n_kv_heads);
  check(p.counters != nullptr && p.counter_ints >= need_counters,
        "decode_attention_async: needs {} zeroed counters, got {} at {}", need_counters, p.counter_ints,
        static_cast<const void*>(p.counters));
  a.partials = static_cast<float*>(p.workspace);  // (the async size covers the synchronized combine's partials too)
  if (!c.unified) {
    // The synchronized kernels instead, where they measured faster (docs/kernels/decode_attention.md,
    // async mode). One split: no partials, so nothing for the unified max to unify, and the
    // synchronized kernel is exact for any logits (no guard, no recomputation). The CUDA-core loop
    // (CTAs of one query head: MHA, and GQA rows split into single heads at small batch): the async
    // kernel's compiled loop streams slower than the sync kernel's from the same source, and its
    // combine saves less than that. On the tensor-core loop async is the faster.
    launch_synchronized(a, c, p.head_dim, p.dtype, fp8, stream);
    return;
  }
  a.counters = p.counters;
  a.fallback_rows = p.fallback_rows;
  // The kernel works in log2 units: 2^(x log2 e - phi log2 e) = e^(x - phi).
  a.phi2 = range.phi * detail::kLog2e;
  a.lo2 = range.a * detail::kLog2e;
  a.hi2 = range.b * detail::kLog2e;
  const int batch = p.batch, n_heads = p.n_heads;
  detail::dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = programmatic_launch_enabled();
    with_head_dim(p.head_dim, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      launch_decode_main<T, D, true>(c, a, fp8, pdl, stream);
      if (c.combine_in_kernel) return;
      with_combine_shape(c.combine, [&](auto shape) {
        using Shape = decltype(shape);
        const detail::LaunchConfig config(dim3(batch * n_heads), dim3(Shape::kThreads), 0, stream, pdl);
        if (fp8) {
          if constexpr (kFp8HeadDim<D>) {
            cuda_check(cudaLaunchKernelEx(config.get(), decode_async_combine_kernel<T, D, Shape, true>, a),
                       "cudaLaunchKernelEx(decode_async_combine_kernel)");
          }
        } else {
          cuda_check(cudaLaunchKernelEx(config.get(), decode_async_combine_kernel<T, D, Shape>, a),
                     "cudaLaunchKernelEx(decode_async_combine_kernel)");
        }
      });
    });
  });
  check_launch("decode_attention_async");
}

}  // namespace fdpp::cuda
