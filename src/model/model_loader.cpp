#include "model/model_loader.h"

#include <sys/stat.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdlib>
#include <memory>
#include <set>

#include "core/cache_dir.h"
#include "fdpp/error.h"
#include "io/gguf.h"
#include "io/weight_source.h"
#include "model/arch/architecture.h"
#include "model/gguf_model.h"
#include "model/hf_config.h"
#include "model/hf_models.h"
#include "model/hf_packed_int.h"
#include "tokenizer/hf_tokenizer.h"

namespace fdpp {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A directory must be an HF model directory; anything else is read as GGUF.
void check_hf_directory(const std::string& path) {
  check(is_hf_directory(path),
        "{}: is a directory without config.json (expected a GGUF file or a Hugging Face model directory)", path);
}

// The GGUF file's architecture (general.architecture in the table of model/arch/architecture.h).
const Architecture& gguf_architecture(const gguf::GgufFile& f) {
  const std::string name = f.get_string("general.architecture");
  const Architecture* a = find_gguf_architecture(name);
  check(a != nullptr, "{}: unsupported architecture '{}' (supported: {})", f.path(), name,
        supported_gguf_architectures());
  return *a;
}

ModelDescription describe_gguf(const gguf::GgufFile& f) {
  ModelDescription d;
  d.path = f.path();
  d.format = "gguf";
  const Architecture& arch = gguf_architecture(f);
  d.config = arch.gguf_config(f);
  std::set<std::string> seen;  // a fused tensor has a spec per slot and is listed once
  for (const GgufTensorSpec& spec : arch.gguf_tensor_specs(d.config)) {
    const gguf::TensorInfo* info = find_gguf_tensor(f, spec, "but the metadata implies");
    if (info == nullptr || !seen.insert(spec.name).second) continue;
    check(gguf::is_supported(info->type), "{}: tensor '{}' has type {}, which fdpp cannot dequantize yet", f.path(),
          spec.name, gguf::type_name(info->type));
    d.tensors.push_back({spec.name, spec.stored_shape(), gguf::type_name(info->type), info->n_bytes});
    d.n_params += info->n_elements;
    d.stored_bytes += info->n_bytes;
    d.dtype_counts[gguf::type_name(info->type)]++;
  }
  return d;
}

}  // namespace

std::string default_model_path() {
  if (const char* env = std::getenv("FDPP_MODEL"); env != nullptr && *env != '\0') return env;
  return cache_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string resolve_model_path(const std::string& path) {
  if (!path.empty()) return path;
  std::string def = default_model_path();
  // $FDPP_MODEL names a file of the user's: the fetch script would not create it, so say only that
  // it is missing.
  if (const char* env = std::getenv("FDPP_MODEL"); env != nullptr && *env != '\0')
    check(exists(def), "{}: no such file or directory (named by $FDPP_MODEL)", def);
  check(exists(def), "{}: default model not found; fetch it with scripts/fetch-default-model.sh or pass --model PATH",
        def);
  return def;
}

ModelDescription describe_hf_model(const HfConfig& h, const WeightSource& source) {
  ModelDescription d;
  d.path = h.directory;
  d.format = source.format();
  d.config = h.config;
  d.eos_token_ids = h.eos_token_ids;
  d.bos_token_id = h.bos_token_id;
  d.quantization = h.quantization.describe();
  const auto specs = hf_tensor_specs(h.config, source);
  check_hf_tensors(source, specs, h.config, h.config_path, h.quantization);
  // A few numbers read here, so that every path from the description (load, plan, info) has them.
  d.config.kv_cache_scales = read_kv_cache_scales(source, h.config);
  for (const HfTensorSpec& spec : specs) {
    if (const SourceTensor* t = source.find(spec.name); t != nullptr) {
      d.tensors.push_back({spec.name, t->shape, t->dtype, t->n_bytes});
      d.n_params += static_cast<uint64_t>(Tensor::numel_of(t->shape));
      d.stored_bytes += t->n_bytes;
      d.dtype_counts[t->dtype]++;
      continue;
    }
    // AWQ / GPTQ: the matrix as its packed tensors (check_hf_tensors found them).
    const std::string module = spec.name.substr(0, spec.name.rfind('.'));
    const PackedIntTensors p = find_packed_int(source, module, spec.shape[0], spec.shape[1], h.quantization);
    for (const SourceTensor* t : {p.qweight, p.qzeros, p.scales, p.g_idx})
      if (t != nullptr) {
        d.tensors.push_back({t->name, t->shape, t->dtype, t->n_bytes});
        d.stored_bytes += t->n_bytes;
      }
    d.n_params += static_cast<uint64_t>(Tensor::numel_of(spec.shape));
    d.dtype_counts[fmt::format("{}{}", h.quantization.quant_method == "awq" ? "AWQ" : "GPTQ",
                               h.quantization.bits)]++;
  }
  return d;
}

DecoderWeights load_hf_model_weights(const HfConfig& h, const WeightSource& source, const ProgressFn& progress) {
  const auto specs = hf_tensor_specs(h.config, source);
  check_hf_tensors(source, specs, h.config, h.config_path, h.quantization);
  return load_hf_decoder(source, h.config, specs, progress, h.quantization);
}

ModelDescription describe_model(const std::string& path) {
  check(exists(path), "{}: no such file or directory", path);
  if (is_directory(path)) {
    check_hf_directory(path);
    const HfConfig h = read_hf_config(path);
    const auto source = open_hf_weights(path);
    return describe_hf_model(h, *source);
  }
  const auto f = gguf::GgufFile::open(path);
  return describe_gguf(f);
}

namespace {
// What load_model and plan_model both open for an HF directory: its config, its weights (headers
// only), the description and the tokenizer (null for a bare checkpoint), checked against each other.
struct OpenedHfModel {
  HfConfig config;
  std::shared_ptr<const WeightSource> source;
  ModelDescription description;
  std::unique_ptr<Tokenizer> tokenizer;
};
OpenedHfModel open_hf_model(const std::string& path) {
  check_hf_directory(path);
  OpenedHfModel m;
  m.config = read_hf_config(path);
  m.source = open_hf_weights(path);
  m.description = describe_hf_model(m.config, *m.source);
  m.tokenizer = load_hf_tokenizer(path, HfTokenizerHints{m.config.model_type, m.config.eos_token_ids,
                                                         m.config.bos_token_id});
  if (m.tokenizer != nullptr)
    check(m.tokenizer->vocab_size() <= m.config.config.vocab_size,
          "{}: tokenizer has {} tokens but the model's vocabulary ({}) is {}", path, m.tokenizer->vocab_size(),
          m.config.config_path, m.config.config.vocab_size);
  return m;
}

// A GGUF file's tokenizer, checked against the model's vocabulary.
std::unique_ptr<Tokenizer> gguf_tokenizer(const std::string& path, const gguf::GgufFile& f, const ModelConfig& c) {
  auto t = Tokenizer::from_gguf(f);
  check(t->vocab_size() <= c.vocab_size, "{}: tokenizer has {} tokens but the model's vocabulary is {}", path,
        t->vocab_size(), c.vocab_size);
  return t;
}
}  // namespace

LoadedModel load_model(const std::string& path, const ProgressFn& progress, const LoadOptions& options) {
  check(exists(path), "{}: no such file or directory", path);
  LoadedModel m;
  if (is_directory(path)) {
    OpenedHfModel h = open_hf_model(path);
    m.description = std::move(h.description);
    m.tokenizer = std::move(h.tokenizer);
    m.weights = load_hf_decoder(*h.source, h.config.config, hf_tensor_specs(h.config.config, *h.source), progress,
                                h.config.quantization);
    return m;
  }
  const auto file = std::make_shared<gguf::GgufFile>(gguf::GgufFile::open(path));
  m.description = describe_gguf(*file);
  m.tokenizer = gguf_tokenizer(path, *file, m.description.config);
  const ModelConfig& c = m.description.config;
  const std::vector<GgufTensorSpec> specs = gguf_architecture(*file).gguf_tensor_specs(c);
  // All read: from here the file serves its tensors only, and the peak of the load comes below.
  file->release_metadata();
#ifdef __GLIBC__
  ::malloc_trim(0);  // the freed metadata and the tokenizer's build-time copies, back to the system
#endif
  m.weights = load_gguf_weights(file, c, specs, progress,
                                options.weights == WeightForm::Stored ? options.stored_types : StoredTypeFilter{});
  if (options.weights == WeightForm::Stored && options.prepare_stored) options.prepare_stored(m.weights, file->on_disk());
  return m;
}

PlannedModel plan_model(const std::string& path) {
  check(exists(path), "{}: no such file or directory", path);
  PlannedModel m;
  if (is_directory(path)) {
    OpenedHfModel h = open_hf_model(path);
    m.description = std::move(h.description);
    m.tokenizer = std::move(h.tokenizer);
    m.plan = plan_hf_weights(*h.source, hf_tensor_specs(h.config.config, *h.source), h.config.quantization);
    m.plan.storage = std::move(h.source);  // the mappings and the read_f32 fallbacks point into it
    return m;
  }
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::open(path));
  m.description = describe_gguf(*file);
  m.tokenizer = gguf_tokenizer(path, *file, m.description.config);
  m.plan = plan_gguf_weights(file, gguf_architecture(*file).gguf_tensor_specs(m.description.config));
  return m;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  check(exists(path), "{}: no such file or directory", path);
  if (is_directory(path)) {
    check_hf_directory(path);
    const HfConfig h = read_hf_config(path);
    auto t = load_hf_tokenizer(path, HfTokenizerHints{h.model_type, h.eos_token_ids, h.bos_token_id});
    check(t != nullptr, "{}: no tokenizer (tokenizer.json, tokenizer.model or vocab.json + merges.txt)", path);
    return t;
  }
  return Tokenizer::from_gguf(gguf::GgufFile::open(path));
}

}  // namespace fdpp
