// Host-callable launchers of the CUDA backend's element-wise, normalization, position, KV-cache,
// attention and sampling kernels. Plain C++ header (no CUDA types beyond cudaStream_t) so that
// host code and tests compiled by the C++ compiler can call them. Every launcher checks its
// arguments' sizes, launches on `stream`, and checks cudaGetLastError() (throws fdpp::Error).
//
// Activations and weights are 16-bit (fp16 or bf16, `DType`); the residual stream is fp32 so
// that a deep model accumulates no 16-bit rounding across layers; all arithmetic is fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/decode_plan.h"
#include "backend/cuda/kernel_options.h"
#include "fdpp/model_config.h"

namespace fdpp::cuda {

enum class DType { F16, BF16 };

// The paged KV cache's element type. Model: the model's 16-bit DType. Fp8E4M3 (`--kv-cache-dtype
// fp8`): one e4m3 byte per element, half the bytes a decode step reads and twice the tokens a pool
// holds; a value x is stored as e4m3(x / scale) (saturating at +-448 after x is rounded to the
// model's DType, so a fused launch writes what the separate ones do) and read as e4m3 * scale,
// one scale for K and one for V per layer (the checkpoint's, else 1 as vLLM's fp8). Head dims 64,
// 128 and 256.
enum class KvDType { Model, Fp8E4M3 };
struct KvQuant {
  KvDType dtype = KvDType::Model;
  float k_scale = 1.f;
  float v_scale = 1.f;
};
inline size_t kv_element_bytes(KvDType t) { return t == KvDType::Fp8E4M3 ? 1 : 2; }
// Every launcher that reads or writes the cache checks its KvQuant here (`what` names the caller):
// a known dtype; with e4m3, head dim 64, 128 or 256 and positive, finite scales.
void check_kv_quant(const KvQuant& kv_quant, int head_dim, const char* what);

// Programmatic dependent launch for the kernels of a decode step (residual_norm, rope_qk_cache,
// decode attention, gemv, flat GEMM without split-K): each may start while the previous kernel
// drains and waits for it on the device (cuda_common.cuh: pdl_wait). What the calling thread's
// KernelOptions say (kernel_options.h: programmatic_launch, with the measurement).
bool programmatic_launch_enabled();
// The GEMV and flat GEMM launches: KernelOptions::linear_programmatic().
bool linear_programmatic_launch_enabled();

// ---- weights ---------------------------------------------------------------------------------
// dst[i] = offset + scale * u_i with u_i uniform in [-1, 1), a counter-based hash of (seed, i):
// the same seed gives the same values whatever the launch shape (random weights for benchmarks).
void fill_random(void* dst, int64_t n, DType dtype, float scale, float offset, uint64_t seed, cudaStream_t stream);

// ---- embedding ------------------------------------------------------------------------------
// x[t, :] = table[ids[t], :] * scale (+ pos_table[positions[t] + pos_offset, :] when pos_table !=
// null), written to the fp32 residual stream. table: [vocab, dim] 16-bit. scale: Gemma's
// sqrt(hidden) (ModelConfig::embed_scale), applied in fp32; 1 leaves the rows as stored.
// (ids are not range-checked on the device: the caller validates them; a negative id gives zeros.)
void embedding(const void* table, const void* pos_table, int pos_offset, DType dtype, const int32_t* ids,
               const int32_t* positions, int n_tokens, int dim, float* x, cudaStream_t stream, float scale = 1.f);

// ---- residual + norm ------------------------------------------------------------------------
// For each row r of [rows, dim]:
//   if delta != null: x[r] += delta[r] (+ delta_bias)      (16-bit delta into the fp32 stream)
//   y = norm(x[r]) * weight (+ bias)                        RMSNorm or LayerNorm (bias nullable)
//   out[r] = y (16-bit);  if write_back: x[r] = y           (post-LN models normalize the stream)
// delta_bias is only applied together with delta (x += delta + delta_bias, in fp32); out may be null
// when write_back is set.
void residual_norm(float* x, const void* delta, const void* delta_bias, const void* weight, const void* bias,
                   void* out, int rows, int dim, double eps, NormType norm, bool write_back, DType dtype,
                   cudaStream_t stream);

// RMSNorm over each head of q and k in place (Qwen3's q_norm / k_norm, before RoPE): qkv is the
// fused projection [n_tokens, (n_heads + 2 n_kv_heads) * head_dim] (q heads, k heads, v heads);
// q heads are scaled by q_weight [head_dim], k heads by k_weight; v is untouched. 16-bit in and
// out, fp32 sums. n_kv_heads 0 (k_weight may then be null) norms rows of [n_tokens, n_heads *
// head_dim] head by head: with n_heads 1, whole rows (Gemma's sandwich norms on a block's output).
void head_rms_norm(void* qkv, int n_tokens, int n_heads, int n_kv_heads, int head_dim, const void* q_weight,
                   const void* k_weight, double eps, DType dtype, cudaStream_t stream);

// ---- element-wise ----------------------------------------------------------------------------
// x[r, :] += bias (16-bit, in place). rows x n.
void add_bias(void* x, const void* bias, int rows, int n, DType dtype, cudaStream_t stream);
// gate_up: [rows, 2 * n] with gate in [:, :n] and up in [:, n:] (the fused gate/up projection's
// output) -> out[rows, n] = silu(gate) * up, or with gelu gelu_tanh(gate) * up (GeGLU: PyTorch's
// tanh approximation, as cpu::gelu_tanh_mul).
void silu_mul(const void* gate_up, void* out, int rows, int n, DType dtype, cudaStream_t stream, bool gelu = false);
// x = cap * tanh(x / cap) in place, n fp32 elements (Gemma 2's final-logit soft-capping).
void soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);
// x += value in place, n elements (a load-time transform: Gemma's (1 + w) norms).
void add_scalar(void* x, int64_t n, float value, DType dtype, cudaStream_t stream);
// x = max(x, 0) in place, rows x n.
void relu(void* x, int rows, int n, DType dtype, cudaStream_t stream);
// dst[r, :] = src[index[r], :] for r < rows; rows of row_bytes bytes (a multiple of 16, both
// buffers 16-byte aligned); index on the device.
void gather_rows(const void* src, const int32_t* index, int rows, int row_bytes, void* dst, cudaStream_t stream);

// ---- linear layers on CUDA cores --------------------------------------------------------------
// y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]) for M <= kGemvMaxM: the weights streamed once with
// 16-byte loads, several rows per warp and many loads in flight (the FastGEMV design; gemv.cu, the
// same kernel as gemv_ex in flat_gemm.h). y is 16-bit, or fp32 when fp32_out. Any K (a multiple
// of 8 with 16-byte aligned x and w takes the fast path, other K a scalar one).
constexpr int kGemvMaxM = 8;
void gemv(const void* x, const void* w, const void* bias, void* y, int M, int N, int K, DType dtype, bool fp32_out,
          cudaStream_t stream);

// ---- rotary embedding ------------------------------------------------------------------------
// In place on qkv [n_tokens, (n_heads + 2 * n_kv_heads) * head_dim] (the fused projection's
// output: q heads, then k heads, then v heads): rotates the first 2 * n_freq dims of each q and k
// head at positions[t] in the given style (see cpu::rope). inv_freq: device [n_freq] fp32.
// rotary_scale multiplies cos and sin (LongRoPE's attention factor: the rotated dims of q and k
// scaled, the others not, as transformers applies it); 1 is plain rope.
void rope_qk(void* qkv, const int32_t* positions, const float* inv_freq, int n_freq, int n_tokens, int n_heads,
             int n_kv_heads, int head_dim, RopeStyle style, DType dtype, cudaStream_t stream,
             float rotary_scale = 1.f);

// ---- paged KV cache --------------------------------------------------------------------------
// Cache layout per layer: k and v each num_blocks blocks of block_size x n_kv_heads rows of
// head_dim 16-bit elements, head-major [block][kv head][key][D] (token-major under
// KernelOptions::kv_head_major = false; kv_cache_layout.h). block_size a power of two.
// Copies the k and v heads of qkv (layout as above) for each token t into slot slots[t]
// (slot = block * block_size + offset). Tokens with a negative slot are skipped (padding).
void kv_cache_write(const void* qkv, const int32_t* slots, int n_tokens, int n_heads, int n_kv_heads, int head_dim,
                    int block_size, void* k_cache, void* v_cache, DType dtype, cudaStream_t stream,
                    const KvQuant& kv_quant = {});

// The q/k norms (Qwen3, Gemma 3) folded into rope_qk_cache: with weights, each q and k head is first normed as
// head_rms_norm does (same bits). Empty: no norm.
struct HeadNorm {
  const void* q_weight = nullptr;  // [head_dim] 16-bit, both or neither
  const void* k_weight = nullptr;
  float eps = 0.f;
};

// rope_qk and kv_cache_write in one launch: q rotated in place, k (rotated) and v written into the
// cache at slots[t] (skipped for negative slots), bit for bit what the two launches give; the k
// heads in qkv are left unrotated (and un-normed). With head_norm: head_rms_norm, then this.
void rope_qk_cache(void* qkv, const int32_t* positions, const float* inv_freq, int n_freq, const int32_t* slots,
                   int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, RopeStyle style,
                   void* k_cache, void* v_cache, DType dtype, cudaStream_t stream, const KvQuant& kv_quant = {},
                   float rotary_scale = 1.f, const HeadNorm& head_norm = {});

// ---- attention -------------------------------------------------------------------------------
// Decode: one query token per sequence. q is read from qkv [batch, (H + 2 KVH) * D] (after rope).
// Sequence b attends to cache positions 0 .. context_lens[b] - 1 through its block table
// block_tables[b * max_blocks_per_seq + i]. out: [batch, H * D] 16-bit. GQA: query head h uses kv
// head h / (H / KVH). Stable softmax (fp32). head_dim: 64, 80, 96, 128, 256 (others: error).
// Any group size (above 16 the group is split over CTAs); block_size a power of two; k/v caches
// 16-byte aligned. A CTA of two or more query heads (and every CTA at head_dim 80, 96, 256) runs
// on tensor cores; MHA at 128 too except on short rows at small batch, MHA at 64 where CTA groups are
// many or rows long, else CUDA cores (decode_attention_launch says which); KernelOptions::decode_path
// forces one (for measurements; read at each call, core only at 64 and 128). context_lens[b] <= 0 writes zeros
// (padding rows); a length beyond the table's capacity (max_blocks_per_seq * block_size) is
// clamped to it. In a programmatic launch (programmatic_launch_enabled) both loops copy their
// first keys before they wait for the previous kernel: the kernels before it in the step may write
// qkv and each row's last key (position context_lens[b] - 1), nothing else it reads; block tables
// and lengths must be in place before the step's first kernel. The same holds for
// decode_attention_async.
//
// The plan (split counts, the launch a call makes, workspace and counter sizes) is host-only C++ in
// decode_plan.h, included here: plan_decode_splits, max_decode_splits, decode_attention_launch,
// decode_attention_workspace_bytes, decode_attention_async_workspace_bytes,
// decode_attention_async_counters.
struct UnifiedMaxRange {
  float phi = 0.f;  // the unified max, natural-log units of x = q.k * scale
  float a = 0.f;    // safe range of (row max - phi)
  float b = 0.f;
};

// The arguments of a decode-attention call (decode_attention, decode_attention_async).
struct DecodeAttentionParams {
  // Inputs and output (device pointers).
  const void* qkv = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [batch][max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [batch]
  void* out = nullptr;
  // Shape.
  int batch = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  float scale = 0.f;
  DType dtype = DType::F16;
  // Split-KV: each sequence's keys are split over `splits` CTAs per kv head, whose partial results
  // are merged after them. workspace: decode_attention_workspace_bytes(batch, n_heads, head_dim,
  // splits) bytes (none for one split), or decode_attention_async_workspace_bytes(...) for the
  // async mode. max_context_len: the longest context_lens[b] of the call, as planned (0: not known,
  // taken as long); it only picks among kernels (decode_attention_launch), never what is computed.
  int splits = 1;
  int max_context_len = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // decode_attention_async only: the unified max and its safe range; counters:
  // decode_attention_async_counters(...) ints, zeroed ONCE before the first call and left at zero
  // (graphs may replay them; a buffer sized for the largest batch serves every smaller one), the
  // in-kernel reduction's per-group semaphores (ints 2 + group), each reset by the group's last CTA;
  // fallback_rows (device, nullable) is incremented by the number of rows recomputed.
  UnifiedMaxRange range = {};
  int* counters = nullptr;
  int counter_ints = 0;
  unsigned long long* fallback_rows = nullptr;
  // Sliding window and soft-capping (Gemma 2/3, Mistral; 0: off). window > 0: row b attends to its
  // last `window` keys only (positions context_lens[b] - window ..); the table's entries before
  // the window's first block are never read (KvBlockAllocator::kFreed there is fine). softcap > 0:
  // each logit x = scale q.k becomes softcap * tanh(x / softcap) before the softmax; in the async
  // mode the unified max and its guard apply to the capped logits (see decode_attention_async).
  // Either one runs separate kernel instantiations (tensor cores only); off, the kernels are those
  // of a model without them.
  int window = 0;
  float softcap = 0.f;
  // The cache's element type (KvQuant): e4m3 caches run the tensor-core loop only.
  KvQuant kv_quant = {};
};

// The synchronized softmax (FlashDecoding's reduction where p.splits > 1: a second kernel merges
// the splits' partials by their maxima). The async fields of p are not read.
void decode_attention(const DecodeAttentionParams& p, cudaStream_t stream);

// Asynchronized softmax with a unified max (FlashDecoding++; attention/unified_max.h has the
// derivation of the range and the CPU reference). Every split of a row accumulates
// sum e^(x - phi) v and sum e^(x - phi) on its own: no exchange of maxima, no rescaling between
// splits. The group's last CTA (few splits, max_context_len at most 8K keys;
// KernelOptions::async_combine) or a second launch adds the splits' sums per row in a fixed order
// (the last CTA in split order, the launch by groups of lanes: bitwise the same on every run). A row
// whose max logit x_max has x_max - phi outside [a, b] (or is NaN) is recomputed exactly with the
// synchronized softmax over all the row's keys (by the reduction, in the kernel or the launch); no
// other launch is made. Soft-capped logits (p.softcap) go through all of this as capped: phi, the
// range and the guard are in units of the capped logit, which lies in [-softcap, softcap], so a
// row's max can never overflow a phi at or above softcap - b; nothing else changes, and any row
// the range does not cover is recomputed exactly as before. With one split there is nothing to unify, and on the CUDA-core loop
// (one query head per CTA) the synchronized kernels measured faster: there decode_attention runs
// (exact for any logits; no row is recomputed; decode_attention_launch says which). The
// result always equals the stable softmax to 16-bit rounding.
// workspace: decode_attention_async_workspace_bytes(...) bytes, 16-byte aligned (the splits'
// partials; no initialization); counters and fallback_rows as DecodeAttentionParams says.
void decode_attention_async(const DecodeAttentionParams& p, cudaStream_t stream);

// Prefill attention on tensor cores (prefill_attention.cu; tile plan in prefill_plan.h), causal
// over the paged KV cache (layout as decode_attention), GQA/MQA (any n_heads / n_kv_heads),
// head_dim 64, 128 or 256 (at 256 only the configurations prefill::config_fits allows; others run
// the default), block_size a power of two; qkv, out and the caches 16-byte aligned.
// window > 0: a row at position p attends to positions p - window + 1 .. p only, and no key below
// the lowest window of a chunk is read (block-table entries there may be KvBlockAllocator::kFreed).
// softcap > 0: logits x = scale q.k -> softcap * tanh(x / softcap) before the softmax (the unified
// max and its guard see the capped logits, as in decode_attention_async). Either runs separate
// kernel instantiations; off (0), the kernels are the plain causal ones.
//
// Variable-length batch of chunks (the mixed step's prefill part): chunk c owns the query rows
// q_begin[c] .. q_begin[c + 1] - 1 of qkv [tokens, (H + 2 KVH) * D] (after rope), at positions
// starts[c] .. starts[c] + n_c - 1 of its sequence (n_c = q_begin[c + 1] - q_begin[c]); each row
// attends to cache positions 0 .. its own position through block_tables[c * max_blocks_per_seq + i]
// (the cache already holds the chunk's keys). out: rows as q, [tokens, H * D]; rows of qkv outside
// every chunk are not written. q_begin [chunks + 1], starts [chunks]: device arrays; the grid is
// sized from the host bounds only (chunks, max_chunk_tokens), so a graph can capture the launch:
// the caller guarantees 0 <= n_c <= max_chunk_tokens and q_begin[chunks] <= total_q_tokens (an
// empty chunk is skipped).
//
// unified_max == nullptr: the synchronized online softmax (FlashAttention-2). Otherwise the
// asynchronized softmax: every row accumulates sum 2^(x - c) v and sum 2^(x - c) against a
// reference c shared by its threads, with no running max. A row's first visible key tile is taken
// against phi (the unified max of FlashDecoding++) in fp32, then c becomes that tile's max; a later
// tile whose max passes c by the top of prefill_attention_effective_range(*unified_max, dtype)
// raises c to it, rescaling once. A row whose first tile's max x has x - phi outside [a, b], or
// whose sum is not finite (NaN or infinite logits), makes its query tile (64 or 128 rows, by
// configuration) recompute its rows with the synchronized softmax; *fallback_rows (device,
// nullable) is incremented by the number of such rows. Every row equals the stable softmax to
// 16-bit rounding.
void prefill_attention_varlen(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                              int max_blocks_per_seq, const int32_t* q_begin, const int32_t* starts, int chunks,
                              int total_q_tokens, int max_chunk_tokens, int n_heads, int n_kv_heads, int head_dim,
                              int block_size, float scale, const UnifiedMaxRange* unified_max,
                              unsigned long long* fallback_rows, void* out, DType dtype, cudaStream_t stream,
                              int config = 0, int window = 0, float softcap = 0.f, const KvQuant& kv_quant = {});

// Tile configurations of the prefill kernel (prefill_plan.h: kConfigs, what each changes): `config`
// of the two launchers is an index 0 .. prefill_attention_configs() - 1; 0 is the default. Names
// (e.g. "m64n64", "m128n64w4") for the CLI and the tests; index -1 / name nullptr when unknown.
int prefill_attention_configs();
const char* prefill_attention_config_name(int config);
int prefill_attention_config_index(const char* name);
// Whether `config` runs as itself at head_dim with a cache of kv_dtype on the current device (else
// the launchers run the default instead): its shared memory and registers fit, and the warpgroup-MMA
// ones need an sm_90a build and a compute capability 9.0 device. A TMA configuration (wg128n128wst)
// over a cache of blocks smaller than 8 keys runs as its cp.async twin (wg128n128ws) instead.
bool prefill_attention_config_runs(int config, int head_dim, KvDType kv_dtype);

// The range of (logit - reference) that 16-bit P = e^(x - c) carries into the tensor cores: [a, b]
// intersected with fp16's [-3 ln 2, 11] (overflow at 65504 = e^11.09; resolution within 8x of the
// synchronized path's; prefill_plan.h has the derivation); bf16 keeps [a, b]. The prefill kernel
// raises a row's reference where a logit would pass the top.
UnifiedMaxRange prefill_attention_effective_range(const UnifiedMaxRange& range, DType dtype);

// One chunk, host-side start and length: n_tokens query tokens at positions start_pos ..
// start_pos + n_tokens - 1, rows 0 .. n_tokens - 1 of qkv and out, block table `block_table`.
void prefill_attention(const void* qkv, const void* k_cache, const void* v_cache, const int32_t* block_table,
                       int start_pos, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size,
                       float scale, void* out, DType dtype, cudaStream_t stream,
                       const UnifiedMaxRange* unified_max = nullptr, unsigned long long* fallback_rows = nullptr,
                       int config = 0, int window = 0, float softcap = 0.f, const KvQuant& kv_quant = {});

// ---- sampling --------------------------------------------------------------------------------
// Per row of logits [rows, vocab] (fp32, modified in place): repetition penalty over that row's
// history (history[r * history_stride .. + history_lens[r]], -1 entries ignored), then greedy
// (temperature <= 0) or temperature, top-k, top-p, min-p and one draw — the same filters, order
// and tie-breaking as the CPU Sampler (src/engine/sampler.h). The draw uses Philox keyed by
// (seed, offsets[r]) so a (seed, step) pair always gives the same token. Writes out_ids[r].
// workspace: from sampling_workspace_bytes(rows, vocab) = 16 bytes per logit + CUB's sort storage
// (the full-sort path: top_k <= 0 or > 1024); the penalty uses 4 bytes per logit of it; greedy and
// 1 <= top_k <= 1024 without a penalty use none (workspace may then be null). offsets are required
// when temperature > 0. seeds (device, nullable): row r draws with key seeds[r] instead of
// params.seed (requests sharing a step each keep their own stream). NaN logits count as -inf.
struct DeviceSamplingParams {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float repeat_penalty;
  uint64_t seed;
};
// Per-row adjustments applied before the filters, in the CPU Sampler's order (all device arrays,
// indexed by the launch's rows; CSR offsets have rows + 1 entries; a null member skips its step):
// bias   entries [bias_offsets[r], bias_offsets[r + 1]) of (bias_ids, bias_values), applied in order
//        before the repetition penalty: a value of -inf sets -inf (the min_tokens mask), others add.
// counts generated tokens [generated_offsets[r], ...+1) of generated_ids, after the repetition
//        penalty: logit -= count * frequency[r] + presence[r] for each distinct one (OpenAI's
//        penalties); uses 4 bytes per logit of the workspace (so a workspace is then required).
struct LogitAdjust {
  const int32_t* bias_offsets = nullptr;
  const int32_t* bias_ids = nullptr;
  const float* bias_values = nullptr;
  const int32_t* generated_offsets = nullptr;
  const int32_t* generated_ids = nullptr;
  const float* presence = nullptr;
  const float* frequency = nullptr;
};
size_t sampling_workspace_bytes(int rows, int vocab);
void sample(float* logits, int rows, int vocab, const int32_t* history, const int32_t* history_lens,
            int history_stride, const DeviceSamplingParams& params, const uint64_t* offsets, int32_t* out_ids,
            void* workspace, size_t workspace_bytes, cudaStream_t stream, const uint64_t* seeds = nullptr,
            const LogitAdjust* adjust = nullptr);
// Log probabilities of the raw logits [*, vocab] (the CPU Sampler::logprobs): for j < count, row
// rows[j] and its sampled token tokens[rows[j]], out[j * out_stride ..] = {logprob, rank, then k
// pairs (id, logprob) of the largest logits (value desc, id asc)} as floats (ids < 2^24 are exact).
// out_stride >= 2 + 2k, k <= vocab. Only these 2 + 2k floats a row go back to the host.
void token_logprobs(const float* logits, int vocab, const int32_t* rows, int count, const int32_t* tokens, int k,
                    float* out, int out_stride, cudaStream_t stream);

// Structured output: for each of `count` rows, logits[head_rows[r] * vocab + i] = -inf where bit i of
// masks[r * words ..] is clear (the token mask the grammar matcher computed on the host).
void apply_token_masks(float* logits, int vocab, const uint32_t* masks, int words, const int32_t* head_rows, int count,
                       cudaStream_t stream);

// Overlapped steps (Engine::overlaps_steps): a step's input ids whose token the previous step drew
// are written on the host as -(2 + h), h that step's head row; ids[i] = drawn[h] for those, in
// place, before the step reads them (drawn: the previous step's sampled ids, still on the device).
void resolve_drawn_tokens(int32_t* ids, int n, const int32_t* drawn, cudaStream_t stream);
// The host's encoding of such an id, and the head row it names (resolve_drawn_tokens' inverse).
constexpr int32_t encode_drawn_token(int head_row) { return -2 - head_row; }

}  // namespace fdpp::cuda
