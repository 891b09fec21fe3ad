#include "backend/cuda/device_model.h"
#include "backend/cuda/fp8.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "backend/cpu/ops.h"
#include "core/half.h"
#include "backend/cuda/weight_streamer.h"
#include "model/weight_plan.h"

namespace fdpp::cuda {

DeviceBuffer DeviceModel::upload(const std::vector<const Tensor*>& parts) {
  int64_t n = 0;
  for (const Tensor* t : parts) n += t->numel();
  if (n == 0) return {};
  std::vector<uint16_t> host(n);
  int64_t at = 0;
  for (const Tensor* t : parts) {
    const float* src = t->ptr();
    const int64_t m = t->numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; ++i) host[at + i] = dtype_ == DType::F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
    at += m;
  }
  DeviceBuffer d(n * sizeof(uint16_t));
  FDPP_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
  bytes_ += d.bytes();
  return d;
}

DeviceBuffer DeviceModel::random(int64_t n, float scale, float offset, uint64_t seed) {
  if (n == 0) return {};
  DeviceBuffer d(n * sizeof(uint16_t));
  fill_random(d.get(), n, dtype_, scale, offset, seed, nullptr);
  bytes_ += d.bytes();
  return d;
}

void DeviceModel::upload_inv_freq() {
  if (config_.position != PositionEncoding::Rope) return;
  // The CUDA engine's context is the model's (LongRope's factor set follows it).
  const std::vector<double> inv = cpu::rope_inv_freq(config_.rope.for_context(config_.max_context));
  std::vector<float> f(inv.begin(), inv.end());
  inv_freq = DeviceBuffer(f.size() * sizeof(float));
  FDPP_CUDA_CHECK(cudaMemcpy(inv_freq.get(), f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (config_.has_local_rope) {
    // As the CPU engine: the local rope's own frequencies, never scaled for the context.
    const std::vector<double> local = cpu::rope_inv_freq(config_.local_rope);
    std::vector<float> lf(local.begin(), local.end());
    local_inv_freq = DeviceBuffer(lf.size() * sizeof(float));
    FDPP_CUDA_CHECK(
        cudaMemcpy(local_inv_freq.get(), lf.data(), lf.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
}

DeviceModel::DeviceModel(const ModelConfig& c, const DecoderWeights& w, DType dtype) : config_(c), dtype_(dtype) {
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  tok_embeddings = upload({&w.tok_embeddings});
  pos_embeddings = upload({&w.pos_embeddings});
  project_in = upload({&w.project_in});
  project_out = upload({&w.project_out});
  for (const LayerWeights& L : w.layers) {
    DeviceLayer d;
    d.attn_norm = upload({&L.attn_norm});
    d.attn_norm_bias = upload({&L.attn_norm_bias});
    d.w_qkv = upload({&L.wq, &L.wk, &L.wv});
    if (c.qkv_bias) d.b_qkv = upload({&L.bq, &L.bk, &L.bv});
    d.q_norm = upload({&L.q_norm});
    d.k_norm = upload({&L.k_norm});
    d.w_o = upload({&L.wo});
    d.b_o = upload({&L.bo});
    d.ffn_norm = upload({&L.ffn_norm});
    d.ffn_norm_bias = upload({&L.ffn_norm_bias});
    d.w_in = swiglu ? upload({&L.w_gate, &L.w_up}) : upload({&L.w_up});
    if (c.mlp_bias) d.b_in = swiglu ? upload({&L.b_gate, &L.b_up}) : upload({&L.b_up});
    d.w_down = upload({&L.w_down});
    d.b_down = upload({&L.b_down});
    d.attn_post_norm = upload({&L.attn_post_norm});
    d.ffn_post_norm = upload({&L.ffn_post_norm});
    d.router = upload({&L.router});
    d.experts_gate = upload({&L.experts_gate});
    d.experts_up = upload({&L.experts_up});
    d.experts_down = upload({&L.experts_down});
    layers.push_back(std::move(d));
  }
  final_norm = upload({&w.final_norm});
  final_norm_bias = upload({&w.final_norm_bias});
  lm_head = upload({&w.lm_head});
  upload_inv_freq();
}

DeviceModel DeviceModel::dummy(const ModelConfig& c, DType dtype, uint64_t seed, int rank, int64_t lm_head_rows) {
  DeviceModel m(c, dtype);
  const int64_t H = c.hidden, E = c.embedding_dim(), Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden,
                V = c.vocab_size;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  const bool layer_norm = c.norm == NormType::LayerNorm;
  uint64_t s = seed;
  auto matrix = [&](int64_t rows, int64_t cols) { return m.random(rows * cols, 1.0f / std::sqrt(float(cols)), 0.f, ++s); };
  auto norm_weight = [&](int64_t n) { return m.random(n, 0.1f, 1.0f, ++s); };
  auto bias = [&](bool present, int64_t n) { return present ? m.random(n, 0.02f, 0.f, ++s) : DeviceBuffer(); };

  m.tok_embeddings = m.random(V * E, 1.0f, 0.f, ++s);
  if (c.position == PositionEncoding::Learned)
    m.pos_embeddings = m.random((c.max_context + c.learned_position_offset) * H, 0.1f, 0.f, ++s);
  if (E != H) {
    m.project_in = matrix(H, E);
    m.project_out = matrix(E, H);
  }
  for (int i = 0; i < c.n_layers; ++i) {
    DeviceLayer d;
    d.attn_norm = norm_weight(H);
    d.attn_norm_bias = bias(layer_norm && c.norm_bias, H);
    d.w_qkv = matrix(Q + 2 * KV, H);
    d.b_qkv = bias(c.qkv_bias, Q + 2 * KV);
    if (c.qk_norm) {
      d.q_norm = norm_weight(c.head_dim);
      d.k_norm = norm_weight(c.head_dim);
    }
    d.w_o = matrix(H, Q);
    d.b_o = bias(c.out_bias && rank == 0, H);
    d.ffn_norm = norm_weight(H);
    d.ffn_norm_bias = bias(layer_norm && c.norm_bias, H);
    if (c.sandwich_norm) {
      d.attn_post_norm = norm_weight(H);
      d.ffn_post_norm = norm_weight(H);
    }
    if (c.is_moe_layer(i)) {
      const int64_t NE = c.n_experts, FE = c.expert_ffn_hidden;
      d.router = matrix(NE, H);
      d.experts_gate = matrix(NE * FE, H);
      d.experts_up = matrix(NE * FE, H);
      d.experts_down = matrix(NE * H, FE);
    } else {
      d.w_in = matrix(swiglu ? 2 * FF : FF, H);
      d.b_in = bias(c.mlp_bias, swiglu ? 2 * FF : FF);
      d.w_down = matrix(H, FF);
      d.b_down = bias(c.mlp_bias && rank == 0, H);
    }
    m.layers.push_back(std::move(d));
  }
  if (c.final_norm) {
    m.final_norm = norm_weight(H);
    m.final_norm_bias = bias(layer_norm && c.norm_bias, H);
  }
  if (lm_head_rows > 0) m.lm_head = matrix(lm_head_rows, E);
  else if (!c.tied_embeddings) m.lm_head = matrix(V, E);
  m.upload_inv_freq();
  FDPP_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

}  // namespace fdpp::cuda

namespace fdpp::cuda {

namespace {

// GPTQ act-order: the columns sorted by group (stable), so that each group's columns are contiguous
// again; empty when they already are (g_idx absent, or k / group_size). Every group must then hold
// group_size columns, as GPTQ assigns them.
std::vector<int32_t> act_order_permutation(const std::vector<int32_t>& group, int group_size, const std::string& what) {
  const int64_t K = static_cast<int64_t>(group.size());
  bool identity = true;
  for (int64_t k = 0; k < K && identity; ++k) identity = group[k] == (group_size > 0 ? k / group_size : 0);
  if (identity) return {};
  std::vector<int32_t> perm(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) perm[k] = static_cast<int32_t>(k);
  std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t b) { return group[a] < group[b]; });
  for (int64_t k = 0; k < K; ++k)
    check(group_size > 0 && group[perm[k]] == k / group_size,
          "{}: g_idx gives groups of unequal size (group {} at sorted column {}, expected {}); the GPU kernels need "
          "{} columns per group",
          what, group[perm[k]], k, group_size > 0 ? k / group_size : 0, group_size);
  return perm;
}

uint64_t packed_device_bytes(const PlannedTensor& t) {
  const HfQuantization& q = t.packed_int->quantization;
  const int stride = int4_zs_stride(t.cols(), q.group_size > 0 ? q.group_size : 0);
  return static_cast<uint64_t>(t.numel()) / 2 + static_cast<uint64_t>(t.rows()) * stride * 4 +
         (q.act_order ? static_cast<uint64_t>(t.cols()) * 4 : 0);
}

// A layer matrix whose parts (q/k/v or gate/up, fused in slot order) are 4-bit AWQ / GPTQ: each part
// unpacked on the host (model/hf_packed_int.h), repacked into int4.h's q4 and zs words and uploaded,
// one part at a time. Returns the q4 words; int4 gets the rest.
DeviceBuffer upload_int4(const std::vector<const PlannedTensor*>& parts, DType dtype, DeviceInt4& int4,
                         const std::string& what) {
  const HfQuantization& q = parts[0]->packed_int->quantization;
  check(q.bits == 4, "{}: the weights are {}-bit GPTQ; the GPU runs 4-bit AWQ and GPTQ weights (run this model with "
        "--device cpu)", what, q.bits);
  const int64_t K = parts[0]->cols();
  int64_t N = 0;
  for (const PlannedTensor* p : parts) {
    check(p->cols() == K, "{}: its parts have rows of {} and {} weights", what, K, p->cols());
    N += p->rows();
  }
  const int gs = q.group_size > 0 ? q.group_size : 0;
  if (const char* why = int4_group_problem(K, gs))
    fail("{}: group size {} with rows of {} weights: {}", what, q.group_size, K, why);
  const int stride = int4_zs_stride(K, gs);
  DeviceBuffer words(static_cast<size_t>(N * K / 2));
  int4.zs = DeviceBuffer(static_cast<size_t>(N) * stride * 4);
  int4.group_size = gs;
  int4.zs_stride = stride;
  std::vector<int32_t> groups, perm;
  int64_t row_at = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const PlannedTensor& p = *parts[i];
    const UnpackedInt u = p.packed_int->unpack(p.rows());
    if (i == 0) {
      groups = u.group;
      perm = act_order_permutation(u.group, gs, what);
    } else {
      check(u.group == groups,
            "{}: {} has other act-order groups (g_idx) than {}; fdpp fuses them into one matrix, so they must agree "
            "(GPTQ gives matrices that read the same input the same g_idx)",
            what, p.src.name, parts[0]->src.name);
    }
    const int64_t rows = p.rows();
    std::vector<uint32_t> q4(static_cast<size_t>(rows * K / 8)), zs(static_cast<size_t>(rows * stride), 0u);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = u.q.data() + r * K;
      for (int64_t j = 0; j < K / 8; ++j) {
        uint32_t word = 0;
        for (int e = 0; e < 8; ++e) {
          const int64_t k = 8 * j + e;
          const uint32_t v = row[perm.empty() ? k : perm[static_cast<size_t>(k)]];
          word |= v << (4 * (e >> 1) + 16 * (e & 1));  // k 8j + 2i in nibble i, 8j + 2i + 1 in nibble i + 4
        }
        q4[static_cast<size_t>(r * (K / 8) + j)] = word;
      }
      for (int64_t g = 0; g < u.groups; ++g) {
        const size_t gi = static_cast<size_t>(r * u.groups + g);
        const uint16_t scale = dtype == DType::F16 ? f32_to_fp16(u.scale[gi]) : f32_to_bf16(u.scale[gi]);
        zs[static_cast<size_t>(r * stride + g)] = scale | (uint32_t(int4_zero_bits(u.zero[gi], dtype)) << 16);
      }
    }
    for (const float s : u.scale)
      check(std::isfinite(dtype == DType::F16 ? fp16_to_f32(f32_to_fp16(s)) : s),
            "{}: scale {} of {} overflows f16 (load this model with --dtype bf16)", what, s, p.src.name);
    FDPP_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(words.get()) + row_at * K / 2, q4.data(), q4.size() * 4,
                               cudaMemcpyHostToDevice));
    FDPP_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(int4.zs.get()) + row_at * stride * 4, zs.data(), zs.size() * 4,
                               cudaMemcpyHostToDevice));
    row_at += rows;
  }
  if (!perm.empty()) {
    int4.perm = DeviceBuffer(perm.size() * sizeof(int32_t));
    FDPP_CUDA_CHECK(cudaMemcpy(int4.perm.get(), perm.data(), int4.perm.bytes(), cudaMemcpyHostToDevice));
  }
  return words;
}

}  // namespace

uint64_t plan_device_bytes(const WeightPlan& plan, bool gguf_blocks) {
  const std::set<const PlannedTensor*> in_blocks = gguf_blocks ? gguf_gpu_block_tensors(plan) : std::set<const PlannedTensor*>{};
  uint64_t n = 0;
  for (const PlannedTensor& t : plan.tensors)
    n += in_blocks.count(&t) > 0 ? t.bytes_of(t.numel())
         : t.packed()            ? packed_device_bytes(t)
         : t.fp8()               ? static_cast<uint64_t>(t.numel()) + t.fp8_scales.size() * sizeof(float)
                                 : static_cast<uint64_t>(t.numel()) * 2;
  return n;
}

void check_gpu_memory(const GpuMemoryNeed& need) {
  size_t free_b = 0, total_b = 0;
  FDPP_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double gib = 1073741824.0;
  const uint64_t sum = need.weights + need.kv_cache + need.activations;
  check(sum <= free_b,
        "the model needs {:.2f} GiB of weights + {:.2f} GiB of KV cache ({} tokens) + {:.2f} GiB of activations = "
        "{:.2f} GiB, but the GPU has {:.2f} GiB free of {:.2f} GiB",
        need.weights / gib, need.kv_cache / gib, need.kv_tokens, need.activations / gib, sum / gib, free_b / gib,
        total_b / gib);
}

DeviceModel DeviceModel::from_plan(const ModelConfig& c, const WeightPlan& plan, DType dtype,
                                   const StreamOptions& options, StreamStats* stats, bool gguf_blocks) {
  DeviceModel m(c, dtype);
  static_assert(GgufMatrix::kMaxSegments >= 3, "q, k and v fuse into one matrix of up to three types");
  const std::set<const PlannedTensor*> in_blocks = gguf_blocks ? gguf_gpu_block_tensors(plan) : std::set<const PlannedTensor*>{};
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  std::vector<StreamJob> jobs;
  // A device buffer made of the planned slots present among `slots`, concatenated in that order
  // (as upload() concatenates the non-empty tensors it is given).
  auto buffer_of = [&](const std::vector<const PlannedTensor*>& parts) {
    int64_t n = 0;
    for (const PlannedTensor* p : parts) {
      check(!p->packed(), "{}: stored as AWQ/GPTQ packed integers, which the GPU takes in the layers' projections "
            "only", p->src.name);
      n += p->numel();
    }
    if (n == 0) return DeviceBuffer();
    DeviceBuffer d(static_cast<size_t>(n) * sizeof(uint16_t));
    int64_t at = 0;
    for (const PlannedTensor* p : parts) {
      jobs.push_back({p, static_cast<uint16_t*>(d.get()) + at});
      at += p->numel();
    }
    m.bytes_ += d.bytes();
    return d;
  };
  auto buffer = [&](std::initializer_list<WeightSlot> slots, int layer) {
    return buffer_of(layer_matrix_parts(plan, slots, layer));
  };
  // An expert slot: one stacked tensor (GGUF) or one part per expert (Hugging Face), in expert order.
  auto experts = [&](WeightSlot slot, int layer) {
    std::vector<const PlannedTensor*> parts;
    for (const PlannedTensor& p : plan.tensors)
      if (p.slot == slot && p.layer == layer && p.numel() > 0) parts.push_back(&p);
    std::stable_sort(parts.begin(), parts.end(),
                     [](const PlannedTensor* a, const PlannedTensor* b) { return a->expert < b->expert; });
    check(parts.size() <= 1 || static_cast<int>(parts.size()) == c.n_experts,
          "layer {}: {} parts of {} for {} experts", layer, parts.size(), slot_name(slot), c.n_experts);
    for (const PlannedTensor* p : parts)
      check(!p->fp8() && !p->packed(),
            "layer {}: {} is stored in {}; the GPU runs expert layers in 16 bits only (run this model with --device "
            "cpu, or dequantize the checkpoint)",
            layer, p->src.name, p->fp8() ? "FP8" : "packed integers");
    return buffer_of(parts);
  };
  // GGUF blocks as stored: runs of parts of one type become the matrix's segments, each starting
  // 16-byte aligned in one buffer.
  auto blocks = [&](const std::vector<const PlannedTensor*>& parts, GgufMatrix& g) {
    const int64_t K = parts[0]->cols();
    std::vector<uint64_t> part_at, segment_at;
    uint64_t bytes = 0;
    g = GgufMatrix();
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto type = static_cast<uint32_t>(parts[i]->src.type);
      if (i == 0 || type != g.segments[g.count - 1].type) {
        bytes = (bytes + 15) / 16 * 16;
        segment_at.push_back(bytes);
        g.segments[g.count++] = {type, 0, nullptr};
      }
      part_at.push_back(bytes);
      g.segments[g.count - 1].rows += static_cast<int>(parts[i]->rows());
      bytes += static_cast<uint64_t>(parts[i]->rows()) * gguf_row_bytes(type, K);
    }
    DeviceBuffer d(static_cast<size_t>(bytes + kGgufBlocksTailBytes));
    for (int i = 0; i < g.count; ++i) g.segments[i].blocks = d.as<uint8_t>() + segment_at[static_cast<size_t>(i)];
    for (size_t i = 0; i < parts.size(); ++i) jobs.push_back({parts[i], d.as<uint8_t>() + part_at[i], true});
    m.bytes_ += d.bytes();
    m.gguf_ = true;
    return d;
  };
  // A layer matrix: 16-bit as buffer() makes it or, when the checkpoint stores its parts in FP8
  // (PlannedTensor::fp8), their e4m3 bytes as stored, with the parts' row scales concatenated into
  // `scale`: per-tensor scales of q, k and v each cover their own rows of the fused matrix; or its
  // GGUF blocks (with gguf_blocks, where keeps_gguf_blocks allows), segments into `g`.
  auto matrix = [&](std::initializer_list<WeightSlot> slots, int layer, DeviceBuffer& scale, DeviceInt4& int4,
                    GgufMatrix& g, const char* what) {
    const std::vector<const PlannedTensor*> parts = layer_matrix_parts(plan, slots, layer);
    // The rule keeps a matrix's parts in blocks all together or not at all.
    if (!parts.empty() && in_blocks.count(parts[0]) > 0) return blocks(parts, g);
    size_t fp8_parts = 0, packed_parts = 0;
    for (const PlannedTensor* p : parts) {
      fp8_parts += p->fp8() ? 1 : 0;
      packed_parts += p->packed() ? 1 : 0;
    }
    if (packed_parts > 0) {
      check(packed_parts == parts.size(),
            "layer {}: the {} weights mix packed integers and 16-bit matrices; fdpp fuses them into one matrix, so "
            "they must be stored alike",
            layer, what);
      DeviceBuffer d = upload_int4(parts, dtype, int4, fmt::format("layer {}: the {} weights", layer, what));
      m.bytes_ += d.bytes() + int4.zs.bytes() + int4.perm.bytes();
      m.int4_ = true;
      return d;
    }
    if (fp8_parts == 0) return buffer(slots, layer);
    check(fp8_parts == parts.size(),
          "layer {}: the {} weights mix FP8 and 16-bit matrices; fdpp fuses them into one matrix, so they must be "
          "stored alike",
          layer, what);
    const int64_t cols = parts[0]->cols();
    check(cols % 16 == 0,
          "layer {}: the {} matrix's rows of {} elements are not a multiple of 16 (the FP8 kernels' granularity)",
          layer, what, cols);
    int64_t n = 0;
    std::vector<float> scales;
    for (const PlannedTensor* p : parts) {
      check(p->cols() == cols && p->fp8_scales.size() == static_cast<size_t>(p->rows()),
            "layer {}: FP8 part {} of the {} matrix has {} columns and {} scales for {} rows", layer, p->src.name, what,
            p->cols(), p->fp8_scales.size(), p->rows());
      n += p->numel();
      scales.insert(scales.end(), p->fp8_scales.begin(), p->fp8_scales.end());
    }
    DeviceBuffer d(static_cast<size_t>(n));
    int64_t at = 0;
    for (const PlannedTensor* p : parts) {
      jobs.push_back({p, d.as<uint8_t>() + at});
      at += p->numel();
    }
    scale = DeviceBuffer(scales.size() * sizeof(float));
    FDPP_CUDA_CHECK(cudaMemcpy(scale.get(), scales.data(), scale.bytes(), cudaMemcpyHostToDevice));
    m.bytes_ += d.bytes() + scale.bytes();
    m.fp8_ = true;
    return d;
  };
  using S = WeightSlot;
  m.tok_embeddings = buffer({S::TokEmbeddings}, -1);
  m.pos_embeddings = buffer({S::PosEmbeddings}, -1);
  m.project_in = buffer({S::ProjectIn}, -1);
  m.project_out = buffer({S::ProjectOut}, -1);
  for (int i = 0; i < c.n_layers; ++i) {
    DeviceLayer d;
    d.attn_norm = buffer({S::AttnNorm}, i);
    d.attn_norm_bias = buffer({S::AttnNormBias}, i);
    d.w_qkv = matrix({S::Wq, S::Wk, S::Wv}, i, d.s_qkv, d.i_qkv, d.g_qkv, "q/k/v");
    if (c.qkv_bias) d.b_qkv = buffer({S::Bq, S::Bk, S::Bv}, i);
    d.q_norm = buffer({S::QNorm}, i);
    d.k_norm = buffer({S::KNorm}, i);
    d.w_o = matrix({S::Wo}, i, d.s_o, d.i_o, d.g_o, "o");
    d.b_o = buffer({S::Bo}, i);
    d.ffn_norm = buffer({S::FfnNorm}, i);
    d.ffn_norm_bias = buffer({S::FfnNormBias}, i);
    d.w_in = swiglu ? matrix({S::WGate, S::WUp}, i, d.s_in, d.i_in, d.g_in, "gate/up")
                    : matrix({S::WUp}, i, d.s_in, d.i_in, d.g_in, "up");
    if (c.mlp_bias) d.b_in = swiglu ? buffer({S::BGate, S::BUp}, i) : buffer({S::BUp}, i);
    d.w_down = matrix({S::WDown}, i, d.s_down, d.i_down, d.g_down, "down");
    d.b_down = buffer({S::BDown}, i);
    d.attn_post_norm = buffer({S::AttnPostNorm}, i);
    d.ffn_post_norm = buffer({S::FfnPostNorm}, i);
    d.router = buffer({S::Router}, i);
    d.experts_gate = experts(S::ExpertsGate, i);
    d.experts_up = experts(S::ExpertsUp, i);
    d.experts_down = experts(S::ExpertsDown, i);
    m.layers.push_back(std::move(d));
  }
  m.final_norm = buffer({S::FinalNorm}, -1);
  m.final_norm_bias = buffer({S::FinalNormBias}, -1);
  m.lm_head = buffer({S::LmHead}, -1);
  m.upload_inv_freq();
  // In file order, so that each shard is read front to back (the kernel's read-ahead then works
  // for a cold page cache too).
  std::stable_sort(jobs.begin(), jobs.end(), [](const StreamJob& a, const StreamJob& b) {
    const StoredTensorRef &x = a.tensor->src, &y = b.tensor->src;
    if (x.file != y.file) return x.file < y.file;
    return x.file.empty() ? x.data < y.data : x.file_offset < y.file_offset;
  });
  const StreamStats s = stream_weights(jobs, dtype, options);
  if (stats != nullptr) *stats = s;
  // Load-time transforms the plan asks for (Gemma's (1 + w) norms): added in fp32 to the 16-bit
  // values, rounded once more.
  for (const StreamJob& j : jobs)
    if (j.tensor->add != 0.f) add_scalar(j.dst, j.tensor->numel(), j.tensor->add, dtype, nullptr);
  FDPP_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}


void DeviceModel::quantize_fp8() {
  if (fp8_) return;
  check(!int4_, "--quantization fp8: the model's weights are already 4-bit (an AWQ or GPTQ checkpoint)");
  check(!gguf_, "--quantization fp8: the layers were loaded as GGUF blocks (load them in 16 bits first)");
  const ModelConfig& c = config_;
  check(!c.has_moe(), "--quantization fp8: expert layers are not quantized yet; run this model in 16 bits");
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  auto quantize = [&](DeviceBuffer& w, DeviceBuffer& scale, int64_t rows, int64_t cols, const char* what) {
    check(w.bytes() == static_cast<size_t>(rows * cols) * 2, "quantize_fp8: {} holds {} bytes, not [{}, {}] 16-bit",
          what, w.bytes(), rows, cols);
    check(cols % 16 == 0, "--quantization fp8: the {} matrix's rows of {} elements are not a multiple of 16", what,
          cols);
    DeviceBuffer q(static_cast<size_t>(rows * cols));
    scale = DeviceBuffer(static_cast<size_t>(rows) * sizeof(float));
    quantize_rows_fp8(w.get(), dtype_, rows, cols, q.as<uint8_t>(), scale.as<float>(), nullptr);
    FDPP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    bytes_ = bytes_ - w.bytes() + q.bytes() + scale.bytes();
    w = std::move(q);
  };
  for (DeviceLayer& L : layers) {
    quantize(L.w_qkv, L.s_qkv, Q + 2 * KV, H, "q/k/v");
    quantize(L.w_o, L.s_o, H, Q, "o");
    quantize(L.w_in, L.s_in, swiglu ? 2 * FF : FF, H, "gate/up");
    quantize(L.w_down, L.s_down, H, FF, "down");
  }
  fp8_ = true;
}

void DeviceModel::quantize_int4() {
  if (int4_) return;
  check(!fp8_, "--quantization int4: the model's weights are already FP8 (an FP8 checkpoint)");
  check(!gguf_, "--quantization int4: the layers were loaded as GGUF blocks (load them in 16 bits first)");
  const ModelConfig& c = config_;
  check(!c.has_moe(), "--quantization int4: expert layers are not quantized yet; run this model in 16 bits");
  const int64_t H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated
  auto quantize = [&](DeviceBuffer& w, DeviceInt4& int4, int64_t rows, int64_t cols, const char* what) {
    check(w.bytes() == static_cast<size_t>(rows * cols) * 2, "quantize_int4: {} holds {} bytes, not [{}, {}] 16-bit",
          what, w.bytes(), rows, cols);
    check(cols % 128 == 0, "--quantization int4: the {} matrix's rows of {} elements are not a multiple of 128", what,
          cols);
    DeviceBuffer q(static_cast<size_t>(rows * cols / 2));
    int4.group_size = 128;
    int4.zs_stride = int4_zs_stride(cols, 128);
    int4.zs = DeviceBuffer(static_cast<size_t>(rows) * int4.zs_stride * 4);
    FDPP_CUDA_CHECK(cudaMemset(int4.zs.get(), 0, int4.zs.bytes()));
    cuda::quantize_int4(w.get(), static_cast<int>(rows), static_cast<int>(cols), dtype_, q.as<uint32_t>(),
                        int4.zs.as<uint32_t>(), nullptr);
    FDPP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    bytes_ = bytes_ - w.bytes() + q.bytes() + int4.zs.bytes();
    w = std::move(q);
  };
  for (DeviceLayer& L : layers) {
    quantize(L.w_qkv, L.i_qkv, Q + 2 * KV, H, "q/k/v");
    quantize(L.w_o, L.i_o, H, Q, "o");
    quantize(L.w_in, L.i_in, swiglu ? 2 * FF : FF, H, "gate/up");
    quantize(L.w_down, L.i_down, H, FF, "down");
  }
  int4_ = true;
}

}  // namespace fdpp::cuda
