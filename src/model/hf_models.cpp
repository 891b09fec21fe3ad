#include "model/hf_models.h"

#include <cmath>
#include <cstring>
#include <span>
#include <unordered_set>

#include "core/fp8_e4m3.h"
#include "model/hf_packed_int.h"
#include "fdpp/error.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

bool readable_dtype(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16"; }

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The index k of a name containing "<part>.k." (any prefix; part "layers." or "experts."), or -1.
int64_t part_index(std::string_view name, std::string_view part) {
  size_t pos = 0;
  while ((pos = name.find(part, pos)) != std::string_view::npos) {
    if (pos == 0 || name[pos - 1] == '.') {
      size_t i = pos + part.size();
      int64_t k = 0;
      size_t digits = 0;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9) k = k * 10 + (name[i++] - '0'), ++digits;
      if (digits > 0 && i < name.size() && name[i] == '.') return k;
    }
    pos += part.size();
  }
  return -1;
}

// The slots an FP8 checkpoint may store in e4m3: the linear layers' weights. Embeddings, norms and
// the lm head stay 16-bit, as vLLM keeps them.
bool fp8_slot(WeightSlot s) {
  switch (s) {
    case WeightSlot::Wq:
    case WeightSlot::Wk:
    case WeightSlot::Wv:
    case WeightSlot::Wo:
    case WeightSlot::WGate:
    case WeightSlot::WUp:
    case WeightSlot::WDown:
      return true;
    default:
      return false;
  }
}

// "X.weight" -> "X" (the module, as quantization configs name it).
std::string module_of(const std::string& weight) {
  return ends_with(weight, ".weight") ? weight.substr(0, weight.size() - 7) : weight;
}

// Whether a (small) tensor holds only zeros: the placeholder biases AutoGPTQ writes.
bool all_zero(const WeightSource& source, const SourceTensor& t) {
  if (t.shape.size() != 1 || t.shape[0] > (int64_t{1} << 20)) return false;
  std::vector<float> v(static_cast<size_t>(t.shape[0]));
  source.read_f32(t, v);
  for (const float x : v)
    if (x != 0.f) return false;
  return true;
}

bool per_tensor_shape(const std::vector<int64_t>& s) {
  return s.empty() || (s.size() == 1 && s[0] == 1) || (s.size() == 2 && s[0] == 1 && s[1] == 1);
}
bool per_channel_shape(const std::vector<int64_t>& s, int64_t rows) {
  return (s.size() == 1 && s[0] == rows) || (s.size() == 2 && s[0] == rows && s[1] == 1);
}

// An F8_E4M3 spec tensor and its scale, without reading data.
void check_fp8_tensor(const WeightSource& source, const HfTensorSpec& spec, const HfQuantization& q,
                      const std::string& config_path) {
  const std::string& origin = source.origin();
  check(q.fp8,
        "{}: tensor '{}' is stored F8_E4M3, but {} has no quantization_config saying how (fdpp loads quant_method "
        "fp8 and compressed-tensors float8 checkpoints)",
        origin, spec.name, config_path);
  bool projection = !spec.parts.empty();
  for (const HfSlotPart& p : spec.parts) projection = projection && fp8_slot(p.slot);
  check(projection,
        "{}: tensor '{}' is stored F8_E4M3, but fdpp loads FP8 only for the q/k/v/o and MLP projections (embeddings, "
        "norms and the lm head stay 16-bit)",
        origin, spec.name);
  check(spec.shape.size() == 2, "{}: FP8 tensor '{}' has shape {}, not a matrix", origin, spec.name,
        shape_string(spec.shape));
  const std::string module = module_of(spec.name);
  check(!q.ignored(module), "{}: tensor '{}' is stored F8_E4M3, but {}'s quantization_config lists '{}' as ignored",
        origin, spec.name, config_path, module);
  const std::string scale_name = module + ".weight_scale";
  const SourceTensor* scale = source.find(scale_name);
  // DeepSeek-style checkpoints name their block scales weight_scale_inv.
  check(scale != nullptr || source.find(module + ".weight_scale_inv") == nullptr,
        "{}: FP8 tensor '{}' has block-wise scales ('{}.weight_scale_inv'), which fdpp does not load (per-tensor or "
        "per-channel weight_scale only)",
        origin, spec.name, module);
  check(scale != nullptr, "{}: FP8 tensor '{}' has no scale: tensor '{}' is missing", origin, spec.name, scale_name);
  check(readable_dtype(scale->dtype),
        "{}: tensor '{}' has dtype {}, which fdpp cannot read (supported: F32, F16, BF16)", origin, scale_name,
        scale->dtype);
  const int64_t rows = spec.shape[0];
  const bool tensor = per_tensor_shape(scale->shape), channel = per_channel_shape(scale->shape, rows);
  check(tensor || channel,
        "{}: tensor '{}' has shape {}; the FP8 weight '{}' of shape {} takes a per-tensor scale ([] or [1]) or a "
        "per-channel one ([{}] or [{}, 1])",
        origin, scale_name, shape_string(scale->shape), spec.name, shape_string(spec.shape), rows, rows);
  check(!(q.weight_strategy == "tensor" && !tensor) && !(q.weight_strategy == "channel" && !channel),
        "{}: tensor '{}' has shape {}, but {}'s quantization_config says weight strategy '{}'", origin, scale_name,
        shape_string(scale->shape), config_path, q.weight_strategy);
}

// An F8_E4M3 tensor's bytes in place (the GPU streams them, the CPU dequantizes them).
RawTensorBytes fp8_bytes(const WeightSource& source, const SourceTensor& t) {
  const RawTensorBytes raw = source.raw_bytes(t);
  check(raw.data != nullptr, "{}: FP8 tensor '{}' is not stored contiguously (fdpp reads FP8 weights in place)",
        source.origin(), t.name);
  check(raw.n_bytes == static_cast<uint64_t>(Tensor::numel_of(t.shape)),
        "{}: FP8 tensor '{}' holds {} bytes, expected {}", source.origin(), t.name, raw.n_bytes,
        Tensor::numel_of(t.shape));
  return raw;
}

// A spec's tensor as fp32: read, or (F8_E4M3) dequantized with its row scales.
void read_spec_f32(const WeightSource& source, const SourceTensor& t, Tensor& dst) {
  if (t.dtype != "F8_E4M3") {
    source.read_f32(t, dst.data);
    return;
  }
  const RawTensorBytes raw = fp8_bytes(source, t);
  const std::vector<float> scale = fp8_row_scales(source, t);
  const int64_t rows = t.shape[0], cols = rows > 0 ? dst.numel() / rows : 0;
  float value[256];  // every e4m3 value: a lookup per element rather than a conversion
  for (int b = 0; b < 256; ++b) value[b] = fp8_e4m3_to_float(static_cast<uint8_t>(b));
  float* out = dst.ptr();
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = scale[static_cast<size_t>(r)] * value[raw.data[r * cols + c]];
}

// The names of the KV cache scale tensors, by their end (read_kv_cache_scales); the more specific
// first, since ".k_proj.k_scale" also ends in ".k_scale". k == v: one tensor for both.
struct KvScaleSuffixes {
  std::string_view k, v;
};
constexpr KvScaleSuffixes kKvScaleSuffixes[] = {
    {".k_proj.output_scale", ".v_proj.output_scale"},
    {".k_proj.k_scale", ".v_proj.v_scale"},
    {".k_scale", ".v_scale"},
    {".kv_scale", ".kv_scale"},
};

// Which cache scales the tensor gives (K, V or both), and its suffix pair; null when none.
const KvScaleSuffixes* kv_scale_suffixes(std::string_view name, bool& k, bool& v) {
  for (const KvScaleSuffixes& s : kKvScaleSuffixes) {
    k = ends_with(name, s.k);
    v = ends_with(name, s.v);
    if (k || v) return &s;
  }
  return nullptr;
}

// The name with its "layers.N." index replaced by layer.
std::string with_layer(const std::string& name, int64_t from, int64_t layer) {
  const std::string old_part = fmt::format("layers.{}.", from);
  const size_t pos = name.find(old_part);
  if (pos == std::string::npos) return name;
  return name.substr(0, pos) + fmt::format("layers.{}.", layer) + name.substr(pos + old_part.size());
}

// One KV cache scale: a single positive, finite number.
float read_kv_scale(const WeightSource& source, const SourceTensor& t) {
  check(readable_dtype(t.dtype), "{}: tensor '{}' has dtype {}, which fdpp cannot read (supported: F32, F16, BF16)",
        source.origin(), t.name, t.dtype);
  check(Tensor::numel_of(t.shape) == 1, "{}: tensor '{}' has shape {}; a KV cache scale is one number ([] or [1])",
        source.origin(), t.name, shape_string(t.shape));
  float value = 0.f;
  source.read_f32(t, std::span<float>(&value, 1));
  check(std::isfinite(value) && value > 0.f, "{}: tensor '{}' holds {}, not a positive finite KV cache scale",
        source.origin(), t.name, value);
  return value;
}

}  // namespace

std::vector<KvCacheScales> read_kv_cache_scales(const WeightSource& source, const ModelConfig& config) {
  const std::string& origin = source.origin();
  struct LayerTensors {
    const SourceTensor* k = nullptr;
    const SourceTensor* v = nullptr;
  };
  std::vector<LayerTensors> found(static_cast<size_t>(config.n_layers));
  const SourceTensor* first_k = nullptr;  // the names a missing scale is told by
  const SourceTensor* first_v = nullptr;
  for (const SourceTensor& t : source.tensors()) {
    bool k = false, v = false;
    if (kv_scale_suffixes(t.name, k, v) == nullptr) continue;
    const int64_t layer = part_index(t.name, "layers.");
    if (layer < 0) continue;  // not an attention layer's
    check(layer < config.n_layers, "{}: tensor '{}' belongs to layer {}, but the model has {} layers", origin, t.name,
          layer, config.n_layers);
    LayerTensors& l = found[static_cast<size_t>(layer)];
    auto take = [&](const SourceTensor*& slot, const SourceTensor*& first, const char* which) {
      if (slot != nullptr)
        fail("{}: tensors '{}' and '{}' both give layer {}'s {} cache scale", origin, slot->name, t.name, layer, which);
      slot = &t;
      if (first == nullptr) first = &t;
    };
    if (k) take(l.k, first_k, "K");
    if (v) take(l.v, first_v, "V");
  }
  if (first_k == nullptr && first_v == nullptr) return {};
  // Published for some layers: every layer must have both, or its cache would silently use 1.
  auto missing = [&](int64_t layer, const SourceTensor* same_kind, const SourceTensor* other_kind, bool want_k) {
    std::string name;
    if (same_kind != nullptr) {
      name = with_layer(same_kind->name, part_index(same_kind->name, "layers."), layer);
    } else {
      // No layer has this kind: the counterpart of the layer's other scale.
      bool k = false, v = false;
      const KvScaleSuffixes* s = kv_scale_suffixes(other_kind->name, k, v);
      const std::string_view from = want_k ? s->v : s->k, to = want_k ? s->k : s->v;
      const std::string base = with_layer(other_kind->name, part_index(other_kind->name, "layers."), layer);
      name = base.substr(0, base.size() - from.size()) + std::string(to);
    }
    fail("{}: tensor '{}' is missing: the checkpoint publishes KV cache scales for other layers ('{}')", origin, name,
         (same_kind != nullptr ? same_kind : other_kind)->name);
  };
  std::vector<KvCacheScales> scales(static_cast<size_t>(config.n_layers));
  for (int64_t layer = 0; layer < config.n_layers; ++layer) {
    const LayerTensors& l = found[static_cast<size_t>(layer)];
    if (l.k == nullptr) missing(layer, first_k, l.v != nullptr ? l.v : first_v, true);
    if (l.v == nullptr) missing(layer, first_v, l.k, false);
    scales[static_cast<size_t>(layer)] = {read_kv_scale(source, *l.k), read_kv_scale(source, *l.v)};
  }
  return scales;
}

std::vector<float> fp8_row_scales(const WeightSource& source, const SourceTensor& weight) {
  check(weight.shape.size() == 2, "{}: FP8 tensor '{}' has shape {}, not a matrix", source.origin(), weight.name,
        shape_string(weight.shape));
  const std::string scale_name = module_of(weight.name) + ".weight_scale";
  const SourceTensor* scale = source.find(scale_name);
  check(scale != nullptr, "{}: FP8 tensor '{}' has no scale: tensor '{}' is missing", source.origin(), weight.name,
        scale_name);
  const int64_t rows = weight.shape[0];
  check(per_tensor_shape(scale->shape) || per_channel_shape(scale->shape, rows),
        "{}: tensor '{}' has shape {}, not a per-tensor or per-channel scale of '{}' ({} rows)", source.origin(),
        scale_name, shape_string(scale->shape), weight.name, rows);
  std::vector<float> s(static_cast<size_t>(Tensor::numel_of(scale->shape)));
  source.read_f32(*scale, s);
  for (const float v : s)
    check(std::isfinite(v), "{}: tensor '{}' holds {}, not a finite scale", source.origin(), scale_name, v);
  if (s.size() == 1) s.assign(static_cast<size_t>(rows), s[0]);
  return s;
}

std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  const int64_t cols = t.shape.size() > 1 ? t.numel() / t.shape[0] : 1;
  int64_t total = 0;
  for (const int64_t r : rows) total += r;
  check(!t.shape.empty() && t.shape[0] == total, "split_rows: tensor of shape {} has not {} rows",
        shape_string(t.shape), total);
  std::vector<Tensor> out;
  int64_t row = 0;
  for (const int64_t r : rows) {
    std::vector<int64_t> shape = t.shape;
    shape[0] = r;
    Tensor part(shape);
    std::memcpy(part.ptr(), t.ptr() + row * cols, static_cast<size_t>(r * cols) * sizeof(float));
    row += r;
    out.push_back(std::move(part));
  }
  return out;
}

HfTensorSpec hf_expert_spec(std::string name, std::vector<int64_t> shape, int layer, int expert, int n_experts,
                            Weight LayerWeights::*member) {
  check(shape.size() == 2 && expert >= 0 && expert < n_experts, "hf_expert_spec: '{}' is not an expert's matrix", name);
  HfSlotPart part{slot_of(member), layer, 0, shape};
  part.expert = expert;
  auto assign = [layer, expert, n_experts, member, shape](DecoderWeights& w, Tensor&& t) {
    Weight& stack = w.layers.at(layer).*member;
    if (stack.empty()) stack = Tensor({n_experts, shape[0], shape[1]});
    const int64_t block = shape[0] * shape[1];
    std::copy(t.data.begin(), t.data.end(), stack.data.begin() + expert * block);
  };
  return {std::move(name), std::move(shape), std::move(assign), {std::move(part)}};
}

std::vector<HfTensorSpec> hf_tensor_specs(const ModelConfig& config, const WeightSource& source) {
  const Architecture* a = find_architecture(config.architecture);
  check(a != nullptr, "{}: no Hugging Face tensor mapping for architecture '{}'", source.origin(), config.architecture);
  return a->hf_tensor_specs(config, source);
}

void check_hf_tensors(const WeightSource& source, const std::vector<HfTensorSpec>& specs, const ModelConfig& config,
                      const std::string& config_path, const HfQuantization& quantization) {
  const std::string& origin = source.origin();
  std::unordered_set<std::string_view> used;
  std::unordered_set<std::string> packed;  // the modules stored as packed integers
  for (const HfTensorSpec& spec : specs) {
    const SourceTensor* t = source.find(spec.name);
    if (t == nullptr && spec.shape.size() == 2 && has_packed_int(source, module_of(spec.name))) {
      const PackedIntTensors p =
          find_packed_int(source, module_of(spec.name), spec.shape[0], spec.shape[1], quantization);
      check(!quantization.ignored(p.module), "{}: '{}' is stored as packed integers, but {}'s quantization_config "
            "lists it as not converted", origin, p.module, config_path);
      for (const SourceTensor* x : {p.qweight, p.qzeros, p.scales, p.g_idx})
        if (x != nullptr) used.insert(x->name);
      packed.insert(p.module);
      continue;
    }
    check(t != nullptr, "{}: tensor '{}' is missing (the model {} describes needs it)", origin, spec.name,
          config_path);
    check(t->shape == spec.shape, "{}: tensor '{}' has shape {}, but {} implies {}", origin, spec.name,
          shape_string(t->shape), config_path, shape_string(spec.shape));
    check(t->dtype != "F8_E5M2", "{}: tensor '{}' is stored F8_E5M2; fdpp loads FP8 weights in e4m3 (F8_E4M3) only",
          origin, spec.name);
    if (t->dtype == "F8_E4M3")
      check_fp8_tensor(source, spec, quantization, config_path);
    else
      check(readable_dtype(t->dtype),
            "{}: tensor '{}' has dtype {}, which fdpp cannot read (supported: F32, F16, BF16; F8_E4M3 in FP8 "
            "checkpoints)",
            origin, spec.name, t->dtype);
    used.insert(spec.name);
  }
  // Tensors the mapping did not take: harmless buffers (rotary inv_freq, a tied lm_head copy) are
  // ignored, but a bias next to a weight we use, or a layer past the configured count, means
  // config.json and the checkpoint disagree, and running would silently compute something else.
  for (const SourceTensor& t : source.tensors()) {
    if (used.count(t.name) != 0) continue;
    if (ends_with(t.name, ".bias")) {
      const std::string module = t.name.substr(0, t.name.size() - 5);
      if (packed.count(module) != 0 && all_zero(source, t)) continue;
      const std::string weight = module + ".weight";
      check(used.count(weight) == 0 && packed.count(module) == 0,
            "{}: tensor '{}' is in the checkpoint, but {} does not call for that bias (attention_bias, mlp_bias, "
            "enable_bias or add_qkv_bias)",
            origin, t.name, config_path);
    }
    const int64_t layer = part_index(t.name, "layers.");
    check(layer < config.n_layers, "{}: tensor '{}' belongs to layer {}, but {} says the model has {} layers", origin,
          t.name, layer, config_path, config.n_layers);
    const int64_t expert = part_index(t.name, "experts.");
    check(expert < config.n_experts, "{}: tensor '{}' belongs to expert {}, but {} says the model has {} experts",
          origin, t.name, expert, config_path, config.n_experts);
  }
}

DecoderWeights load_hf_decoder(const WeightSource& source, const ModelConfig& config,
                               const std::vector<HfTensorSpec>& specs, const ProgressFn& progress,
                               const HfQuantization& quantization) {
  uint64_t total = 0, done = 0;
  for (const HfTensorSpec& s : specs) total += static_cast<uint64_t>(Tensor::numel_of(s.shape));
  DecoderWeights w;
  w.layers.resize(config.n_layers);
  for (const HfTensorSpec& spec : specs) {
    const SourceTensor* t = source.find(spec.name);
    Tensor tensor(spec.shape);
    if (t == nullptr && spec.shape.size() == 2 && has_packed_int(source, module_of(spec.name))) {
      const PackedIntTensors p =
          find_packed_int(source, module_of(spec.name), spec.shape[0], spec.shape[1], quantization);
      dequantize_packed_int(source, p, quantization, tensor);
    } else {
      check(t != nullptr, "{}: tensor '{}' is missing", source.origin(), spec.name);
      check(t->shape == spec.shape, "{}: tensor '{}' has shape {}, expected {}", source.origin(), spec.name,
            shape_string(t->shape), shape_string(spec.shape));
      read_spec_f32(source, *t, tensor);
    }
    done += static_cast<uint64_t>(tensor.numel());
    spec.assign(w, std::move(tensor));
    if (progress) progress(total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0);
  }
  return w;
}

}  // namespace fdpp

namespace fdpp {

namespace {

gguf::GgmlType stored_type(const std::string& dtype) {
  if (dtype == "F32") return gguf::GgmlType::F32;
  if (dtype == "F16") return gguf::GgmlType::F16;
  if (dtype == "BF16") return gguf::GgmlType::BF16;
  fail("dtype {} cannot be loaded (supported: F32, F16, BF16)", dtype);
}

}  // namespace

WeightPlan plan_hf_weights(const WeightSource& source, const std::vector<HfTensorSpec>& specs,
                           const HfQuantization& quantization) {
  WeightPlan plan;
  for (const HfTensorSpec& spec : specs) {
    const SourceTensor* t = source.find(spec.name);
    if (t == nullptr && spec.shape.size() == 2 && has_packed_int(source, module_of(spec.name))) {
      auto packed = std::make_shared<PackedIntPart>();
      packed->source = &source;
      packed->tensors = find_packed_int(source, module_of(spec.name), spec.shape[0], spec.shape[1], quantization);
      packed->quantization = quantization;
      packed->out = spec.shape[0];
      packed->in = spec.shape[1];
      for (const HfSlotPart& part : spec.parts) {
        check(part.add == 0.f && part.row_begin + Tensor::numel_of(part.shape) / spec.shape[1] <= spec.shape[0],
              "{}: '{}' is stored as packed integers, which its slot {} cannot take", source.origin(), spec.name,
              slot_name(part.slot));
        PlannedTensor p;
        p.slot = part.slot;
        p.layer = part.layer;
        p.shape = part.shape;
        p.expert = part.expert;
        p.src.name = packed->tensors.module;
        p.src.type = gguf::GgmlType::I8;
        auto row_part = std::make_shared<PackedIntPart>(*packed);
        row_part->row_begin = part.row_begin;
        p.packed_int = std::move(row_part);
        plan.tensors.push_back(std::move(p));
      }
      continue;
    }
    check(t != nullptr, "{}: tensor '{}' is missing", source.origin(), spec.name);
    check(t->shape == spec.shape, "{}: tensor '{}' has shape {}, expected {}", source.origin(), spec.name,
          shape_string(t->shape), shape_string(spec.shape));
    const bool fp8 = t->dtype == "F8_E4M3";
    // FP8: the e4m3 bytes, one per element (I8 only gives their size; fp8_scales says what they are).
    const gguf::GgmlType type = fp8 ? gguf::GgmlType::I8 : stored_type(t->dtype);
    const uint64_t elem = gguf::block_bytes(type);
    const int64_t numel = Tensor::numel_of(t->shape);
    const int64_t cols = t->shape.empty() || t->shape[0] == 0 ? 1 : numel / t->shape[0];
    const RawTensorBytes raw = fp8 ? fp8_bytes(source, *t) : source.raw_bytes(*t);
    const std::vector<float> row_scales = fp8 ? fp8_row_scales(source, *t) : std::vector<float>();
    if (raw.data != nullptr)
      check(raw.n_bytes == static_cast<uint64_t>(numel) * elem, "{}: tensor '{}' holds {} bytes, expected {}",
            source.origin(), spec.name, raw.n_bytes, static_cast<uint64_t>(numel) * elem);
    for (const HfSlotPart& part : spec.parts) {
      PlannedTensor p;
      p.slot = part.slot;
      p.layer = part.layer;
      p.shape = part.shape;
      p.add = part.add;
      p.expert = part.expert;
      const int64_t n = p.numel();
      const uint64_t begin = static_cast<uint64_t>(part.row_begin * cols) * elem;
      check(part.row_begin * cols + n <= numel, "{}: tensor '{}': slot {} reaches past its end", source.origin(),
            spec.name, slot_name(part.slot));
      if (fp8) p.fp8_scales.assign(row_scales.begin() + part.row_begin, row_scales.begin() + part.row_begin + p.rows());
      p.src.name = spec.name;
      p.src.type = type;
      p.src.n_bytes = static_cast<uint64_t>(n) * elem;
      if (raw.data != nullptr) {
        p.src.data = raw.data + begin;
        if (!raw.file.empty()) p.src.file = raw.file, p.src.file_offset = raw.file_offset + begin;
      } else {
        // Not in place: the whole tensor through read_f32, this part's rows kept.
        const int64_t first = part.row_begin * cols;
        p.src.type = gguf::GgmlType::F32;
        p.src.n_bytes = static_cast<uint64_t>(n) * 4;
        p.src.read_f32 = [&source, t, numel, first, n](std::span<float> dst) {
          std::vector<float> all(static_cast<size_t>(numel));
          source.read_f32(*t, all);
          std::copy(all.begin() + first, all.begin() + first + n, dst.begin());
        };
      }
      plan.tensors.push_back(std::move(p));
    }
  }
  return plan;
}

}  // namespace fdpp
