#include "model/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "fdpp/error.h"
#include "io/gguf.h"

namespace fdpp {

namespace {

// llama.cpp's converter permutes the rows of attn_q/attn_k within each head so that its RoPE can
// rotate adjacent pairs; HF checkpoints (and fdpp) rotate halves. Undo it:
// GGUF row (2 i + j) of a head is HF row (j * head_dim / 2 + i).
void unpermute_rows_for_rotate_half(Tensor& t, int n_heads) {
  if (t.empty()) return;
  const int64_t rows = t.shape[0];
  const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t head_dim = rows / n_heads;
  const int64_t half = head_dim / 2;
  std::vector<float> out(t.data.size());
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t src = h * head_dim + 2 * i + j;
        const int64_t dst = h * head_dim + j * half + i;
        std::memcpy(&out[dst * cols], &t.data[src * cols], cols * sizeof(float));
      }
  t.data = std::move(out);
}

// The same permutation for a stored view: row n of the HF-ordered matrix is GGUF row order[n].
void unpermute_rows_for_rotate_half(StoredMatrix& m, int n_heads) {
  if (m.empty()) return;
  const int64_t head_dim = m.rows / n_heads, half = head_dim / 2;
  auto order = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(m.rows));
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        (*order)[static_cast<size_t>(h * head_dim + j * half + i)] = static_cast<int32_t>(h * head_dim + 2 * i + j);
  m.row_order = std::move(order);
}

// The slots that are Weights (a stored view is possible), null for plain Tensors.
Weight* weight_slot(DecoderWeights& w, WeightSlot s, int layer) {
  switch (s) {
    case WeightSlot::TokEmbeddings:
      return &w.tok_embeddings;
    case WeightSlot::LmHead:
      return &w.lm_head;
    default:
      break;
  }
  if (!is_layer_slot(s)) return nullptr;
  check(layer >= 0 && static_cast<size_t>(layer) < w.layers.size(), "weight slot {} of layer {}: no such layer",
        slot_name(s), layer);
  LayerWeights& l = w.layers[static_cast<size_t>(layer)];
  switch (s) {
    case WeightSlot::Wq:
      return &l.wq;
    case WeightSlot::Wk:
      return &l.wk;
    case WeightSlot::Wv:
      return &l.wv;
    case WeightSlot::Wo:
      return &l.wo;
    case WeightSlot::WGate:
      return &l.w_gate;
    case WeightSlot::WUp:
      return &l.w_up;
    case WeightSlot::WDown:
      return &l.w_down;
    case WeightSlot::ExpertsGate:
      return &l.experts_gate;
    case WeightSlot::ExpertsUp:
      return &l.experts_up;
    case WeightSlot::ExpertsDown:
      return &l.experts_down;
    default:
      return nullptr;
  }
}

}  // namespace

StoredMatrix make_stored_view(gguf::GgmlType type, const uint8_t* data, int64_t rows, int64_t cols) {
  check(gguf::is_known(type), "unknown tensor type {}", static_cast<uint32_t>(type));
  const uint64_t be = gguf::block_elements(type);
  check(rows >= 0 && cols > 0 && static_cast<uint64_t>(cols) % be == 0,
        "a {} matrix needs rows of whole {}-element blocks, got {} columns", gguf::type_name(type), be, cols);
  StoredMatrix m;
  m.type = type;
  m.data = data;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = static_cast<uint64_t>(cols) / be * gguf::block_bytes(type);
  return m;
}

const gguf::TensorInfo* find_gguf_tensor(const gguf::GgufFile& f, const GgufTensorSpec& spec, const char* what) {
  const gguf::TensorInfo* info = f.find_tensor(spec.name);
  if (info == nullptr) {
    check(!spec.required, "{}: tensor '{}' is missing", f.path(), spec.name);
    return nullptr;
  }
  // GGUF dims are innermost-first; our shapes are outermost-first.
  const std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());
  check(shape == spec.stored_shape(), "{}: tensor '{}' has shape {}, {} {}", f.path(), spec.name, shape_string(shape),
        what, shape_string(spec.stored_shape()));
  return info;
}

std::vector<GgufTensorSpec> fused_gguf_rows(const std::string& name, int64_t cols, int layer,
                                            const std::vector<std::pair<WeightSlot, int64_t>>& slots) {
  int64_t rows = 0;
  for (const auto& [slot, n] : slots) rows += n;
  std::vector<GgufTensorSpec> out;
  int64_t begin = 0;
  for (const auto& [slot, n] : slots) {
    GgufTensorSpec s{name, {n, cols}, slot, layer};
    s.fused_shape = {rows, cols};
    s.row_begin = begin;
    out.push_back(std::move(s));
    begin += n;
  }
  return out;
}

namespace {

// Where a fused spec's rows lie in its tensor's bytes: the byte offset of row_begin and the bytes
// of the slot's rows (whole rows of whole blocks, checked).
std::pair<uint64_t, uint64_t> row_range_bytes(const gguf::GgufFile& f, const gguf::TensorInfo& info,
                                              const GgufTensorSpec& spec) {
  const std::vector<int64_t>& whole = spec.stored_shape();
  const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
  const int64_t cols = whole.size() < 2 ? 1 : Tensor::numel_of(whole) / whole[0];
  const uint64_t be = gguf::block_elements(info.type);
  check(static_cast<uint64_t>(cols) % be == 0 && spec.row_begin >= 0 && spec.row_begin + rows <= whole[0],
        "{}: tensor '{}' cannot be split at rows [{}, {}) (type {}, {} columns)", f.path(), spec.name, spec.row_begin,
        spec.row_begin + rows, gguf::type_name(info.type), cols);
  const uint64_t row_bytes = static_cast<uint64_t>(cols) / be * gguf::block_bytes(info.type);
  return {static_cast<uint64_t>(spec.row_begin) * row_bytes, static_cast<uint64_t>(rows) * row_bytes};
}

}  // namespace

DecoderWeights load_gguf_weights(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& c,
                                 const std::vector<GgufTensorSpec>& specs, const ProgressFn& progress,
                                 const StoredTypeFilter& stored_types) {
  const gguf::GgufFile& f = *file;
  uint64_t total = 0, done = 0;
  for (const auto& s : specs) total += static_cast<uint64_t>(Tensor::numel_of(s.shape));

  // A fused tensor is dequantized once for all of its slots: the last one read is kept.
  std::string fused_name;
  std::vector<float> fused;
  auto load = [&](const GgufTensorSpec& spec) {
    Tensor t;
    const gguf::TensorInfo* info = find_gguf_tensor(f, spec);
    if (info == nullptr) return t;
    t = Tensor(spec.shape);
    if (spec.fused_shape.empty()) {
      f.read_f32(*info, t.data);
    } else {
      row_range_bytes(f, *info, spec);  // checks the range
      if (fused_name != spec.name) {
        fused.assign(info->n_elements, 0.f);
        f.read_f32(*info, fused);
        fused_name = spec.name;
      }
      const int64_t cols = t.numel() / std::max<int64_t>(spec.shape[0], 1);
      std::copy_n(fused.begin() + spec.row_begin * cols, t.numel(), t.data.begin());
    }
    done += static_cast<uint64_t>(t.numel());
    if (progress) progress(static_cast<double>(done) / static_cast<double>(total));
    return t;
  };
  // A weight matrix: a view into the mapping when asked for and the fast path has kernels for its
  // type (nothing is read now: pages come in as the first forward touches them), else fp32. A
  // stack of experts' matrices [experts, rows, cols] is viewed as one of experts * rows rows.
  bool any_stored = false;
  auto load_matrix = [&](const GgufTensorSpec& spec) {
    Weight w;
    const auto* info = f.find_tensor(spec.name);
    if (stored_types && info != nullptr && stored_types(info->type) &&
        (spec.shape.size() == 2 || (spec.shape.size() == 3 && is_expert_slot(spec.slot)))) {
      find_gguf_tensor(f, spec);
      const auto bytes = f.tensor_bytes(*info);
      // Rows of whole matrices: a stack of experts is one of experts * rows rows, a fused tensor's
      // slot its rows from row_begin.
      const int64_t cols = spec.shape.back(), rows = Tensor::numel_of(spec.shape) / cols;
      const int64_t stored_rows = Tensor::numel_of(spec.stored_shape()) / cols;
      uint64_t first = 0;  // byte offset of the slot's first row (a fused tensor's row range)
      if (!spec.fused_shape.empty()) first = row_range_bytes(f, *info, spec).first;
      w.stored = make_stored_view(info->type, bytes.data() + first, rows, cols);
      if (spec.shape.size() == 3) w.stored.matrices = spec.shape[0];
      check(w.stored.row_bytes * static_cast<uint64_t>(stored_rows) == bytes.size(),
            "{}: tensor '{}' holds {} bytes, expected {}", f.path(), spec.name, bytes.size(),
            w.stored.row_bytes * static_cast<uint64_t>(stored_rows));
      any_stored = true;
      done += static_cast<uint64_t>(Tensor::numel_of(spec.shape));
      if (progress) progress(static_cast<double>(done) / static_cast<double>(total));
      return w;
    }
    w = load(spec);
    return w;
  };

  DecoderWeights w;
  w.layers.resize(c.n_layers);
  for (const GgufTensorSpec& spec : specs) {
    check(spec.permute_heads == 0 || spec.fused_shape.empty(), "tensor '{}': a fused row range is never permuted",
          spec.name);
    if (Weight* m = weight_slot(w, spec.slot, spec.layer)) {
      *m = load_matrix(spec);
      if (spec.permute_heads > 0) {
        unpermute_rows_for_rotate_half(static_cast<Tensor&>(*m), spec.permute_heads);
        unpermute_rows_for_rotate_half(m->stored, spec.permute_heads);
      }
    } else {
      Tensor& t = slot_tensor(w, spec.slot, spec.layer);
      t = load(spec);
      if (spec.permute_heads > 0) unpermute_rows_for_rotate_half(t, spec.permute_heads);
    }
  }
  if (any_stored) w.storage = std::move(file);
  return w;
}

WeightPlan plan_gguf_weights(std::shared_ptr<const gguf::GgufFile> file, const std::vector<GgufTensorSpec>& specs) {
  const gguf::GgufFile& f = *file;
  WeightPlan plan;
  for (const GgufTensorSpec& spec : specs) {
    const gguf::TensorInfo* info = find_gguf_tensor(f, spec);
    if (info == nullptr) continue;
    check(gguf::is_supported(info->type), "{}: tensor '{}' has type {}, which fdpp cannot dequantize yet", f.path(),
          spec.name, gguf::type_name(info->type));
    PlannedTensor p;
    p.slot = spec.slot;
    p.layer = spec.layer;
    p.shape = spec.shape;
    p.src.name = spec.name;
    p.src.type = info->type;
    const auto bytes = f.tensor_bytes(*info);
    p.src.data = bytes.data();
    p.src.n_bytes = bytes.size();
    uint64_t first = 0;  // a fused tensor's slot: its rows only
    if (!spec.fused_shape.empty()) std::tie(first, p.src.n_bytes) = row_range_bytes(f, *info, spec);
    p.src.data += first;
    if (f.on_disk()) p.src.file = f.path(), p.src.file_offset = info->offset + first;
    // As load_gguf_weights: q/k rows (and their biases) back to rotate-half order.
    p.permute_heads = spec.permute_heads;
    plan.tensors.push_back(std::move(p));
  }
  plan.storage = std::move(file);
  return plan;
}

}  // namespace fdpp
