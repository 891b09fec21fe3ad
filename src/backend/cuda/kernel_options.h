// The kernels' launch switches: programmatic dependent launch, cuBLASLt's algorithm tuning and the
// decode-attention loop. They are options of an engine (cuda::EngineOptions::kernels), not of the
// process: the library reads no environment variable for them (the CLI maps flags, and the
// FDPP_* variables where a flag is not given, into them: runtime/environment_fallback.h).
//
// The launchers are free functions called from many places (the engine, tools, tests), so the
// options reach them through the calling thread: a KernelOptionsScope makes an options object the
// thread's current one for its lifetime, and current_kernel_options() is what a launcher reads.
// CudaEngine opens a scope in each of its public calls; under tensor parallelism every rank's
// engine runs on its own thread, so each GPU sees its own engine's options. Without a scope (a
// test or tool calling kernels directly) the defaults below apply. Passing the options through
// every launcher's signature would say the same with some hundred more parameters.
//
// Plain C++17 (no CUDA; the .cu files include it), so that the CPU code that fills the options can
// include it too.
#pragma once

#include <optional>

namespace fdpp::cuda {

// Which loop decode attention runs (decode_plan.h: choose_loop): Auto decides by the query
// group, the head dim and, for MHA, the batch and the longest row; Mma forces the tensor cores;
// Core the CUDA cores (head dims 64 and 128 only; other head dims always run on the tensor cores).
enum class DecodePath { Auto, Mma, Core };

inline const char* decode_path_name(DecodePath p) {
  return p == DecodePath::Mma ? "mma" : p == DecodePath::Core ? "core" : "auto";
}

// How decode_attention_async adds the splits' partials when there are several (decode_plan.h:
// combine_in_kernel): Kernel: the last CTA of each group to finish, inside the attention kernel (no
// second launch); Launch: decode_async_combine_kernel, a second launch of one CTA per row; Auto:
// Kernel with 2 splits up to 8K keys, and at batch 1 with up to kAsyncKernelCombineMaxSplits, else
// Launch (the measurements: docs/kernels/decode_attention.md, async combine).
enum class AsyncCombine { Auto, Kernel, Launch };

inline const char* async_combine_name(AsyncCombine c) {
  return c == AsyncCombine::Kernel ? "kernel" : c == AsyncCombine::Launch ? "launch" : "auto";
}

// Which kernels compute the experts of a mixture-of-experts layer (moe.h): Auto chooses by the
// step's token count (moe.h: moe_use_tensor_cores), Mma forces the tensor-core grouped GEMM, Core
// the CUDA-core grouped GEMV. A measurement switch (FDPP_MOE_PATH).
enum class MoePath { Auto, Mma, Core };
inline const char* moe_path_name(MoePath p) { return p == MoePath::Mma ? "mma" : p == MoePath::Core ? "core" : "auto"; }

struct KernelOptions {
  // Programmatic dependent launch for the kernels of a decode step (residual_norm, rope_qk_cache,
  // decode attention, and the linear kernels unless linear_programmatic_launch says otherwise):
  // each may start while the previous kernel drains. On by default: on the H200 it made every
  // measured decode step faster, by 0.2-3.4% (Llama-2-7B, Llama-3-8B, OPT-6.7B, ChatGLM2-6B at
  // batch 1, 8, 32; docs/performance-log.md).
  bool programmatic_launch = true;
  // The GEMV and flat GEMM launches apart from the rest (measurements); unset: as above.
  std::optional<bool> linear_programmatic_launch;
  // Split-K flat GEMM launches programmatic too. Off: with it the Llama-2-7B down projection
  // ([4096, 11008], 4 splits) measured 24.8 -> 29.0 us at M = 1 and the decode step +5%
  // (docs/performance-log.md).
  bool split_k_programmatic_launch = false;
  // Time cuBLASLt's top candidates the first time a shape is seen (linear.h); off: take its
  // heuristic's first.
  bool cublaslt_tune = true;
  DecodePath decode_path = DecodePath::Auto;
  // Warps per decode-attention CTA at head dims 64 and 128 (both loops): 0 = auto (4 where the
  // tensor-core loop has CTA groups for 3/4 of two CTAs per SM, else 8: one CTA per SM at head_dim 128;
  // decode_plan.h, choose_loop; the measurements: docs/kernels/decode_attention.md, loop and warps),
  // 4 (two or three CTAs per SM) or 8.
  // plan_decode_splits reads it too (its waves count the resident CTAs), so a plan and its launches
  // must see the same value. A measurement switch (bench-attention --decode-warps).
  int decode_warps = 0;
  AsyncCombine async_combine = AsyncCombine::Auto;
  // The GPU KV cache's layout, for its writers and both attention kernels alike (kv_cache_layout.h,
  // with the measurements): true = head-major [block][kv head][token][D] (a head's block_size rows
  // adjacent), false = token-major [block][token][kv head][D] (a token's heads adjacent; a
  // measurement switch: bench-attention --kv-layout token-major).
  bool kv_head_major = true;
  MoePath moe_path = MoePath::Auto;
  // Qwen3's and Gemma 3's q/k norms folded into the rotary kernel (one launch fewer a layer). Off: their own
  // launch (the same bits; a measurement switch, FDPP_FOLD_NORMS).
  bool fold_norms = true;

  bool linear_programmatic() const { return linear_programmatic_launch.value_or(programmatic_launch); }
};

namespace detail {
inline thread_local const KernelOptions* current_kernel_options = nullptr;
}  // namespace detail

// The options of the innermost KernelOptionsScope on this thread, else the defaults.
inline const KernelOptions& current_kernel_options() {
  static const KernelOptions defaults;
  const KernelOptions* o = detail::current_kernel_options;
  return o != nullptr ? *o : defaults;
}

// Makes `options` this thread's current options until the scope ends (scopes nest; the options
// must outlive the scope).
class KernelOptionsScope {
 public:
  explicit KernelOptionsScope(const KernelOptions& options) : previous_(detail::current_kernel_options) {
    detail::current_kernel_options = &options;
  }
  ~KernelOptionsScope() { detail::current_kernel_options = previous_; }
  KernelOptionsScope(const KernelOptionsScope&) = delete;
  KernelOptionsScope& operator=(const KernelOptionsScope&) = delete;

 private:
  const KernelOptions* previous_;
};

}  // namespace fdpp::cuda
