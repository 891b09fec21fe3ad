#include "model/llama.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/quant_matmul.h"
#include "fdpp/error.h"
#include "io/gguf.h"

namespace fdpp {

namespace {

// GGUF architectures that use the Llama recipe and llama.cpp's tensor names.
bool is_llama_family(const std::string& arch) { return arch == "llama" || arch == "mistral"; }

int to_int(uint64_t v, const std::string& path, const char* key) {
  check(v <= (1u << 30), "{}: metadata {} = {} is out of range", path, key, v);
  return static_cast<int>(v);
}

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

}  // namespace

ModelConfig llama_config_from_gguf(const gguf::GgufFile& f) {
  const std::string& path = f.path();
  ModelConfig c;
  c.architecture = f.get_string("general.architecture");
  check(is_llama_family(c.architecture), "{}: unsupported architecture '{}' (supported: llama, mistral)", path,
        c.architecture);
  const std::string a = c.architecture;
  auto key = [&](const char* suffix) { return fmt::format("{}.{}", a, suffix); };
  auto get_int = [&](const std::string& k) { return to_int(f.get_uint(k), path, k.c_str()); };
  auto get_int_or = [&](const std::string& k, int fallback) { return to_int(f.get_uint(k, fallback), path, k.c_str()); };

  c.name = f.get_string("general.name", "");
  c.n_layers = get_int(key("block_count"));
  c.hidden = get_int(key("embedding_length"));
  c.ffn_hidden = get_int(key("feed_forward_length"));
  c.n_heads = get_int(key("attention.head_count"));
  c.n_kv_heads = get_int_or(key("attention.head_count_kv"), c.n_heads);
  check(c.n_heads > 0, "{}: {} must be positive", path, key("attention.head_count"));
  c.head_dim = get_int_or(key("attention.key_length"), c.hidden / c.n_heads);
  c.max_context = get_int_or(key("context_length"), 2048);
  c.norm_eps = f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5);
  c.rope.theta = f.get_float(key("rope.freq_base"), 10000.0);
  c.rope.rotary_dim = get_int_or(key("rope.dimension_count"), c.head_dim);
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    c.rope.scaling = RopeScaling::Linear;
    c.rope.factor = f.get_float(key("rope.scaling.factor"));
  } else {
    check(scaling == "none", "{}: rope scaling '{}' is not supported (supported: none, linear)", path, scaling);
  }
  if (const auto* factors = f.find_tensor("rope_freqs.weight")) {
    check(factors->n_elements == static_cast<uint64_t>(c.rope.rotary_dim / 2),
          "{}: rope_freqs.weight has {} elements, expected rotary_dim / 2 = {}", path, factors->n_elements,
          c.rope.rotary_dim / 2);
    std::vector<float> v(factors->n_elements);
    f.read_f32(*factors, v);
    for (float x : v) {
      check(std::isfinite(x) && x > 0, "{}: rope_freqs.weight holds {}, expected positive factors", path, x);
      c.rope.freq_factors.push_back(x);
    }
  }
  // vocab size: the metadata key when present, else the tokenizer's vocabulary length, else the
  // embedding's shape.
  if (f.find(key("vocab_size")) != nullptr) {
    c.vocab_size = get_int(key("vocab_size"));
  } else if (f.find("tokenizer.ggml.tokens") != nullptr) {
    c.vocab_size = static_cast<int>(f.get_string_array("tokenizer.ggml.tokens").size());
  } else if (const auto* emb = f.find_tensor("token_embd.weight"); emb != nullptr && emb->dims.size() == 2) {
    c.vocab_size = to_int(emb->dims[1], path, "token_embd.weight dims[1]");
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.out_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.mlp_bias = f.find_tensor("blk.0.ffn_up.bias") != nullptr;
  validate(c, path);
  return c;
}

std::vector<TensorSpec> llama_gguf_tensor_specs(const ModelConfig& c) {
  const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), ff = c.ffn_hidden, v = c.vocab_size;
  std::vector<TensorSpec> s;
  s.push_back({"token_embd.weight", {v, h}});
  for (int i = 0; i < c.n_layers; ++i) {
    auto n = [i](const char* suffix) { return fmt::format("blk.{}.{}", i, suffix); };
    s.push_back({n("attn_norm.weight"), {h}});
    s.push_back({n("attn_q.weight"), {q, h}});
    s.push_back({n("attn_k.weight"), {kv, h}});
    s.push_back({n("attn_v.weight"), {kv, h}});
    s.push_back({n("attn_output.weight"), {h, q}});
    if (c.qkv_bias) {
      s.push_back({n("attn_q.bias"), {q}});
      s.push_back({n("attn_k.bias"), {kv}});
      s.push_back({n("attn_v.bias"), {kv}});
    }
    if (c.out_bias) s.push_back({n("attn_output.bias"), {h}});
    s.push_back({n("ffn_norm.weight"), {h}});
    s.push_back({n("ffn_gate.weight"), {ff, h}});
    s.push_back({n("ffn_up.weight"), {ff, h}});
    s.push_back({n("ffn_down.weight"), {h, ff}});
    if (c.mlp_bias) {
      s.push_back({n("ffn_gate.bias"), {ff}});
      s.push_back({n("ffn_up.bias"), {ff}});
      s.push_back({n("ffn_down.bias"), {h}});
    }
  }
  s.push_back({"output_norm.weight", {h}});
  if (!c.tied_embeddings) s.push_back({"output.weight", {v, h}});
  return s;
}

DecoderWeights load_llama_gguf(const gguf::GgufFile& f, const ModelConfig& c, const ProgressFn& progress) {
  // A non-owning shared_ptr: nothing is kept, since fp32 tensors own their data.
  return load_llama_gguf(std::shared_ptr<const gguf::GgufFile>(&f, [](const gguf::GgufFile*) {}), c, progress,
                         WeightForm::F32);
}

DecoderWeights load_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& c,
                               const ProgressFn& progress, WeightForm form) {
  const gguf::GgufFile& f = *file;
  const auto specs = llama_gguf_tensor_specs(c);
  uint64_t total = 0, done = 0;
  for (const auto& s : specs) total += static_cast<uint64_t>(Tensor::numel_of(s.shape));

  auto load = [&](const TensorSpec& spec) {
    Tensor t;
    const auto* info = f.find_tensor(spec.name);
    if (info == nullptr) {
      check(!spec.required, "{}: tensor '{}' is missing", f.path(), spec.name);
      return t;
    }
    // GGUF dims are innermost-first; our shapes are outermost-first.
    std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());
    check(shape == spec.shape, "{}: tensor '{}' has shape {}, expected {}", f.path(), spec.name,
          shape_string(shape), shape_string(spec.shape));
    t = Tensor(shape);
    f.read_f32(*info, t.data);
    done += static_cast<uint64_t>(t.numel());
    if (progress) progress(static_cast<double>(done) / static_cast<double>(total));
    return t;
  };
  // A weight matrix: a view into the mapping when asked for and the fast path has kernels for its
  // type (nothing is read now: pages come in as the first forward touches them), else fp32.
  bool any_stored = false;
  auto load_matrix = [&](const TensorSpec& spec) {
    Weight w;
    const auto* info = f.find_tensor(spec.name);
    if (form == WeightForm::Stored && info != nullptr && cpu::stored_supported(info->type) && spec.shape.size() == 2) {
      std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());
      check(shape == spec.shape, "{}: tensor '{}' has shape {}, expected {}", f.path(), spec.name,
            shape_string(shape), shape_string(spec.shape));
      const auto bytes = f.tensor_bytes(*info);
      w.stored = cpu::make_stored_view(info->type, bytes.data(), shape[0], shape[1]);
      check(w.stored.row_bytes * static_cast<uint64_t>(shape[0]) == bytes.size(),
            "{}: tensor '{}' holds {} bytes, expected {}", f.path(), spec.name, bytes.size(),
            w.stored.row_bytes * static_cast<uint64_t>(shape[0]));
      any_stored = true;
      done += info->n_elements;
      if (progress) progress(static_cast<double>(done) / static_cast<double>(total));
      return w;
    }
    w = load(spec);
    return w;
  };

  DecoderWeights w;
  size_t i = 0;
  w.tok_embeddings = load_matrix(specs[i++]);
  w.layers.resize(c.n_layers);
  for (auto& L : w.layers) {
    L.attn_norm = load(specs[i++]);
    L.wq = load_matrix(specs[i++]);
    L.wk = load_matrix(specs[i++]);
    L.wv = load_matrix(specs[i++]);
    L.wo = load_matrix(specs[i++]);
    if (c.qkv_bias) {
      L.bq = load(specs[i++]);
      L.bk = load(specs[i++]);
      L.bv = load(specs[i++]);
    }
    if (c.out_bias) L.bo = load(specs[i++]);
    L.ffn_norm = load(specs[i++]);
    L.w_gate = load_matrix(specs[i++]);
    L.w_up = load_matrix(specs[i++]);
    L.w_down = load_matrix(specs[i++]);
    if (c.mlp_bias) {
      L.b_gate = load(specs[i++]);
      L.b_up = load(specs[i++]);
      L.b_down = load(specs[i++]);
    }
    unpermute_rows_for_rotate_half(L.wq, c.n_heads);
    unpermute_rows_for_rotate_half(L.wk, c.n_kv_heads);
    unpermute_rows_for_rotate_half(L.wq.stored, c.n_heads);
    unpermute_rows_for_rotate_half(L.wk.stored, c.n_kv_heads);
    unpermute_rows_for_rotate_half(L.bq, c.n_heads);
    unpermute_rows_for_rotate_half(L.bk, c.n_kv_heads);
  }
  w.final_norm = load(specs[i++]);
  if (!c.tied_embeddings) w.lm_head = load_matrix(specs[i++]);
  if (any_stored) w.storage = std::move(file);
  return w;
}

}  // namespace fdpp

namespace fdpp {

namespace {

// llama.cpp's names -> slots (the table load_llama_gguf follows by position).
struct GgufSlotName {
  const char* suffix;
  WeightSlot slot;
};
constexpr GgufSlotName kLayerSlots[] = {
    {"attn_norm.weight", WeightSlot::AttnNorm},   {"attn_q.weight", WeightSlot::Wq},
    {"attn_k.weight", WeightSlot::Wk},            {"attn_v.weight", WeightSlot::Wv},
    {"attn_output.weight", WeightSlot::Wo},       {"attn_q.bias", WeightSlot::Bq},
    {"attn_k.bias", WeightSlot::Bk},              {"attn_v.bias", WeightSlot::Bv},
    {"attn_output.bias", WeightSlot::Bo},         {"ffn_norm.weight", WeightSlot::FfnNorm},
    {"ffn_gate.weight", WeightSlot::WGate},       {"ffn_up.weight", WeightSlot::WUp},
    {"ffn_down.weight", WeightSlot::WDown},       {"ffn_gate.bias", WeightSlot::BGate},
    {"ffn_up.bias", WeightSlot::BUp},             {"ffn_down.bias", WeightSlot::BDown},
};

std::pair<WeightSlot, int> gguf_slot(const std::string& name) {
  if (name == "token_embd.weight") return {WeightSlot::TokEmbeddings, -1};
  if (name == "output_norm.weight") return {WeightSlot::FinalNorm, -1};
  if (name == "output.weight") return {WeightSlot::LmHead, -1};
  int layer = -1;
  size_t used = 0;
  if (name.starts_with("blk.")) {
    layer = 0;
    size_t i = 4;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') layer = layer * 10 + (name[i++] - '0');
    used = i + 1;
  }
  if (layer >= 0 && used < name.size())
    for (const GgufSlotName& s : kLayerSlots)
      if (name.compare(used, std::string::npos, s.suffix) == 0) return {s.slot, layer};
  fail("GGUF tensor '{}' has no weight slot", name);
}

}  // namespace

WeightPlan plan_llama_gguf(std::shared_ptr<const gguf::GgufFile> file, const ModelConfig& c) {
  const gguf::GgufFile& f = *file;
  WeightPlan plan;
  for (const TensorSpec& spec : llama_gguf_tensor_specs(c)) {
    const gguf::TensorInfo* info = f.find_tensor(spec.name);
    if (info == nullptr) {
      check(!spec.required, "{}: tensor '{}' is missing", f.path(), spec.name);
      continue;
    }
    std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());
    check(shape == spec.shape, "{}: tensor '{}' has shape {}, expected {}", f.path(), spec.name, shape_string(shape),
          shape_string(spec.shape));
    check(gguf::is_supported(info->type), "{}: tensor '{}' has type {}, which fdpp cannot dequantize yet", f.path(),
          spec.name, gguf::type_name(info->type));
    const auto [slot, layer] = gguf_slot(spec.name);
    PlannedTensor p;
    p.slot = slot;
    p.layer = layer;
    p.shape = spec.shape;
    p.src.name = spec.name;
    p.src.type = info->type;
    const auto bytes = f.tensor_bytes(*info);
    p.src.data = bytes.data();
    p.src.n_bytes = bytes.size();
    if (f.on_disk()) p.src.file = f.path(), p.src.file_offset = info->offset;
    // As load_llama_gguf: q/k rows (and their biases) back to rotate-half order.
    if (slot == WeightSlot::Wq || slot == WeightSlot::Bq) p.permute_heads = c.n_heads;
    if (slot == WeightSlot::Wk || slot == WeightSlot::Bk) p.permute_heads = c.n_kv_heads;
    plan.tensors.push_back(std::move(p));
  }
  plan.storage = std::move(file);
  return plan;
}

}  // namespace fdpp
