#include "model/weight_plan.h"

#include <algorithm>
#include <cstring>

#include "core/fp8_e4m3.h"
#include "fdpp/error.h"

namespace fdpp {

namespace {

constexpr const char* kSlotNames[kWeightSlots] = {
    "tok_embeddings", "pos_embeddings", "project_in", "project_out", "final_norm", "final_norm_bias", "lm_head",
    "attn_norm", "attn_norm_bias", "wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo", "ffn_norm", "ffn_norm_bias",
    "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down", "q_norm", "k_norm", "attn_post_norm", "ffn_post_norm", "router", "experts_gate", "experts_up", "experts_down"};

template <class W, class L>
auto* slot_ptr(W& w, WeightSlot s, int layer) {
  using T = std::conditional_t<std::is_const_v<W>, const Tensor, Tensor>;
  if (!is_layer_slot(s)) {
    switch (s) {
      case WeightSlot::TokEmbeddings: return static_cast<T*>(&w.tok_embeddings);
      case WeightSlot::PosEmbeddings: return static_cast<T*>(&w.pos_embeddings);
      case WeightSlot::ProjectIn: return static_cast<T*>(&w.project_in);
      case WeightSlot::ProjectOut: return static_cast<T*>(&w.project_out);
      case WeightSlot::FinalNorm: return static_cast<T*>(&w.final_norm);
      case WeightSlot::FinalNormBias: return static_cast<T*>(&w.final_norm_bias);
      case WeightSlot::LmHead: return static_cast<T*>(&w.lm_head);
      default: break;
    }
  }
  check(layer >= 0 && static_cast<size_t>(layer) < w.layers.size(), "weight slot {} of layer {}: no such layer",
        slot_name(s), layer);
  L& l = w.layers[static_cast<size_t>(layer)];
  switch (s) {
    case WeightSlot::AttnNorm: return static_cast<T*>(&l.attn_norm);
    case WeightSlot::AttnNormBias: return static_cast<T*>(&l.attn_norm_bias);
    case WeightSlot::Wq: return static_cast<T*>(&l.wq);
    case WeightSlot::Wk: return static_cast<T*>(&l.wk);
    case WeightSlot::Wv: return static_cast<T*>(&l.wv);
    case WeightSlot::Bq: return static_cast<T*>(&l.bq);
    case WeightSlot::Bk: return static_cast<T*>(&l.bk);
    case WeightSlot::Bv: return static_cast<T*>(&l.bv);
    case WeightSlot::Wo: return static_cast<T*>(&l.wo);
    case WeightSlot::Bo: return static_cast<T*>(&l.bo);
    case WeightSlot::FfnNorm: return static_cast<T*>(&l.ffn_norm);
    case WeightSlot::FfnNormBias: return static_cast<T*>(&l.ffn_norm_bias);
    case WeightSlot::WGate: return static_cast<T*>(&l.w_gate);
    case WeightSlot::WUp: return static_cast<T*>(&l.w_up);
    case WeightSlot::WDown: return static_cast<T*>(&l.w_down);
    case WeightSlot::BGate: return static_cast<T*>(&l.b_gate);
    case WeightSlot::BUp: return static_cast<T*>(&l.b_up);
    case WeightSlot::BDown: return static_cast<T*>(&l.b_down);
    case WeightSlot::QNorm: return static_cast<T*>(&l.q_norm);
    case WeightSlot::KNorm: return static_cast<T*>(&l.k_norm);
    case WeightSlot::AttnPostNorm: return static_cast<T*>(&l.attn_post_norm);
    case WeightSlot::FfnPostNorm: return static_cast<T*>(&l.ffn_post_norm);
    case WeightSlot::Router: return static_cast<T*>(&l.router);
    case WeightSlot::ExpertsGate: return static_cast<T*>(&l.experts_gate);
    case WeightSlot::ExpertsUp: return static_cast<T*>(&l.experts_up);
    case WeightSlot::ExpertsDown: return static_cast<T*>(&l.experts_down);
    default: break;
  }
  fail("weight slot {}: unknown", static_cast<int>(s));
}

}  // namespace

const char* slot_name(WeightSlot s) {
  const int i = static_cast<int>(s);
  return i >= 0 && i < kWeightSlots ? kSlotNames[i] : "?";
}

WeightSlot slot_of_address(const void* member, const void* object, bool layer) {
  // The probe object's own slots, compared by address (members of any type).
  if (layer) {
    const auto& l = *static_cast<const LayerWeights*>(object);
    DecoderWeights w;
    for (int s = static_cast<int>(WeightSlot::AttnNorm); s < kWeightSlots; ++s) {
      w.layers.resize(1);
      const Tensor* t = slot_ptr<const DecoderWeights, const LayerWeights>(w, WeightSlot(s), 0);
      const auto offset = reinterpret_cast<const char*>(t) - reinterpret_cast<const char*>(&w.layers[0]);
      if (reinterpret_cast<const char*>(&l) + offset == member) return WeightSlot(s);
    }
  } else {
    const auto& d = *static_cast<const DecoderWeights*>(object);
    for (int s = 0; s < static_cast<int>(WeightSlot::AttnNorm); ++s)
      if (slot_ptr<const DecoderWeights, const LayerWeights>(d, WeightSlot(s), -1) == member) return WeightSlot(s);
  }
  fail("slot_of: the member is not a weight slot");
}

Tensor& slot_tensor(DecoderWeights& w, WeightSlot s, int layer) {
  return *slot_ptr<DecoderWeights, LayerWeights>(w, s, layer);
}
const Tensor& slot_tensor(const DecoderWeights& w, WeightSlot s, int layer) {
  return *slot_ptr<const DecoderWeights, const LayerWeights>(w, s, layer);
}

const PlannedTensor* WeightPlan::find(WeightSlot s, int layer) const {
  for (const PlannedTensor& t : tensors)
    if (t.slot == s && (!is_layer_slot(s) || t.layer == layer)) return &t;
  return nullptr;
}

uint64_t WeightPlan::stored_bytes() const {
  uint64_t n = 0;
  for (const PlannedTensor& t : tensors) n += t.src.n_bytes;
  return n;
}

int64_t WeightPlan::elements() const {
  int64_t n = 0;
  for (const PlannedTensor& t : tensors) n += t.numel();
  return n;
}

const std::vector<std::vector<WeightSlot>>& layer_matrix_slots() {
  using S = WeightSlot;
  static const std::vector<std::vector<WeightSlot>> groups = {
      {S::Wq, S::Wk, S::Wv}, {S::Wo}, {S::WGate, S::WUp}, {S::WDown}};
  return groups;
}

std::vector<const PlannedTensor*> layer_matrix_parts(const WeightPlan& plan, std::span<const WeightSlot> slots,
                                                     int layer) {
  std::vector<const PlannedTensor*> parts;
  for (const WeightSlot s : slots)
    if (const PlannedTensor* p = plan.find(s, layer); p != nullptr && p->numel() > 0) parts.push_back(p);
  return parts;
}

bool gguf_gpu_block_type(gguf::GgmlType type) {
  using T = gguf::GgmlType;
  return type == T::Q4_0 || type == T::Q4_1 || type == T::Q8_0 || type == T::Q4_K || type == T::Q5_K ||
         type == T::Q6_K;
}

std::set<const PlannedTensor*> gguf_gpu_block_tensors(const WeightPlan& plan) {
  // The kernels index a row's elements in 32 bits with room to spare.
  constexpr int64_t kMaxRow = int64_t{1} << 24;
  auto kept = [](const PlannedTensor* p, int64_t K) {
    return gguf_gpu_block_type(p->src.type) && p->src.data != nullptr && !p->fp8() && !p->packed() &&
           p->stored_cols == 0 && p->add == 0.f && p->expert < 0 && p->cols() == K && K <= kMaxRow &&
           K % static_cast<int64_t>(gguf::block_elements(p->src.type)) == 0;
  };
  int layers = 0;
  for (const PlannedTensor& t : plan.tensors) layers = std::max(layers, t.layer + 1);
  std::set<const PlannedTensor*> in_blocks;
  for (int layer = 0; layer < layers; ++layer)
    for (const auto& slots : layer_matrix_slots()) {
      const auto parts = layer_matrix_parts(plan, slots, layer);
      if (!parts.empty() &&
          std::all_of(parts.begin(), parts.end(), [&](const PlannedTensor* p) { return kept(p, parts[0]->cols()); }))
        in_blocks.insert(parts.begin(), parts.end());
    }
  return in_blocks;
}

WeightPlan plan_from_weights(const DecoderWeights& w, const ModelConfig& config) {
  WeightPlan plan;
  auto add = [&](WeightSlot s, int layer) {
    const Tensor& t = slot_tensor(w, s, layer);
    if (t.numel() == 0) return;
    PlannedTensor p;
    p.slot = s;
    p.layer = is_layer_slot(s) ? layer : -1;
    p.shape = t.shape;
    p.src.name = is_layer_slot(s) ? fmt::format("layers.{}.{}", layer, slot_name(s)) : slot_name(s);
    p.src.type = gguf::GgmlType::F32;
    p.src.data = reinterpret_cast<const uint8_t*>(t.ptr());
    p.src.n_bytes = static_cast<uint64_t>(t.numel()) * sizeof(float);
    plan.tensors.push_back(std::move(p));
  };
  for (int s = 0; s < static_cast<int>(WeightSlot::AttnNorm); ++s) add(WeightSlot(s), -1);
  for (int layer = 0; layer < config.n_layers; ++layer)
    for (int s = static_cast<int>(WeightSlot::AttnNorm); s < kWeightSlots; ++s) add(WeightSlot(s), layer);
  return plan;
}

DecoderWeights materialize_plan(const WeightPlan& plan, const ModelConfig& config) {
  DecoderWeights w;
  w.layers.resize(static_cast<size_t>(config.n_layers));
  for (const PlannedTensor& p : plan.tensors) {
    Tensor stored(p.shape);
    if (p.packed()) {
      check(p.shape.size() == 2, "{}: packed integers planned for a slot of shape {}", p.src.name,
            shape_string(p.shape));
      p.packed_int->unpack(p.rows()).dequantize(stored.ptr());
    } else if (p.fp8()) {
      check(p.src.data != nullptr && p.stored_cols == 0 && static_cast<int64_t>(p.fp8_scales.size()) == p.rows() &&
                p.src.n_bytes == static_cast<uint64_t>(p.numel()),
            "{}: FP8 tensor planned without its bytes in place or a scale per row", p.src.name);
      const int64_t rows = p.rows(), cols = p.cols();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          stored.ptr()[r * cols + c] =
              p.fp8_scales[static_cast<size_t>(r)] * fp8_e4m3_to_float(p.src.data[r * cols + c]);
    } else if (p.src.data != nullptr && p.stored_cols > 0) {
      const int64_t rows = p.rows(), cols = p.cols();
      for (int64_t r = 0; r < rows; ++r)
        gguf::dequantize(p.src.type, p.src.data + r * p.stored_row_bytes() + p.col_byte_offset(),
                         stored.ptr() + r * cols, static_cast<uint64_t>(cols));
    } else if (p.src.data != nullptr) {
      check(p.numel() % static_cast<int64_t>(gguf::block_elements(p.src.type)) == 0,
            "{}: {} elements are not whole blocks of {}", p.src.name, p.numel(), gguf::type_name(p.src.type));
      gguf::dequantize(p.src.type, p.src.data, stored.ptr(), static_cast<uint64_t>(p.numel()));
    } else {
      check(static_cast<bool>(p.src.read_f32), "{}: the plan gives no way to read it", p.src.name);
      p.src.read_f32(stored.data);
    }
    if (p.add != 0.f)
      for (float& x : stored.data) x += p.add;
    Tensor& dst = slot_tensor(w, p.slot, p.layer);
    if (p.expert >= 0) {
      // One expert's block of a stacked slot, the stack sized by the model's expert count.
      check(is_expert_slot(p.slot) && p.shape.size() == 2 && p.expert < config.n_experts,
            "{}: expert {} of slot {} does not fit the model's {} experts", p.src.name, p.expert, slot_name(p.slot),
            config.n_experts);
      if (dst.empty()) dst = Tensor({config.n_experts, p.shape[0], p.shape[1]});
      check(dst.shape == std::vector<int64_t>{config.n_experts, p.shape[0], p.shape[1]},
            "{}: expert {} has shape {}, its stack {}", p.src.name, p.expert, shape_string(p.shape),
            shape_string(dst.shape));
      std::memcpy(dst.ptr() + p.expert * p.numel(), stored.ptr(), static_cast<size_t>(p.numel()) * sizeof(float));
    } else if (p.permute_heads > 0) {
      Tensor out(p.shape);
      const int64_t rows = p.rows(), cols = p.cols();
      for (int64_t n = 0; n < rows; ++n)
        std::memcpy(out.ptr() + n * cols, stored.ptr() + planned_source_row(n, rows, p.permute_heads) * cols,
                    static_cast<size_t>(cols) * sizeof(float));
      dst = std::move(out);
    } else {
      dst = std::move(stored);
    }
  }
  return w;
}

}  // namespace fdpp
