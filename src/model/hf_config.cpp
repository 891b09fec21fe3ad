#include "model/hf_config.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "fdpp/error.h"
#include "model/arch/architecture.h"

namespace fdpp {

namespace {

using nlohmann::json;

// eos_token_id / bos_token_id: an int, a list of ints, or null.
void collect_ids(const json& j, const char* key, const std::string& origin, std::vector<int32_t>& out) {
  if (!j.contains(key) || j.at(key).is_null()) return;
  const json& v = j.at(key);
  auto add = [&](const json& x) {
    check(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX,
          "{}: {} holds {}, which is not a token id", origin, key, json_show(x));
    const auto id = static_cast<int32_t>(x.get<int64_t>());
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (v.is_array()) {
    for (const json& x : v) add(x);
  } else {
    add(v);
  }
}

bool exists(const std::string& path, bool want_dir) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  return want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode);
}

}  // namespace

bool is_hf_directory(const std::string& path) { return exists(path, true) && exists(path + "/config.json", false); }

HfConfig parse_hf_config(const json& j, const json* generation, const std::string& directory,
                         const std::string& origin) {
  check(j.is_object(), "{}: expected a JSON object, got {}", origin, json_show(j));
  const JsonFields f(j, origin);
  HfConfig h;
  h.directory = directory;
  h.config_path = origin;
  h.model_type = f.string_or("model_type", "");
  if (f.has("architectures")) {
    const json& a = j.at("architectures");
    check(a.is_array() && !a.empty() && a[0].is_string(), "{}: architectures = {} is not a list of names", origin,
          json_show(a));
    h.hf_architecture = a[0].get<std::string>();
  } else if (const HfArchitectureName* n = find_hf_model_type(h.model_type)) {
    h.hf_architecture = n->architecture;
  } else {
    fail("{}: neither architectures nor a known model_type ('{}') says what the model is (supported: {})", origin,
         h.model_type, supported_hf_architectures());
  }
  const Architecture* arch = find_hf_architecture(h.hf_architecture);
  check(arch != nullptr, "{}: unsupported architecture '{}' (supported: {})", origin, h.hf_architecture,
        supported_hf_architectures());
  ModelConfig& c = h.config;
  arch->parse_hf_config(j, h.hf_architecture, h.model_type, origin, c);
  h.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  h.quantization = parse_hf_quantization(j, origin);
  c.name = f.string_or("_name_or_path", "");
  if (c.name.empty()) {
    std::string d = directory;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const size_t slash = d.rfind('/');
    c.name = slash == std::string::npos ? d : d.substr(slash + 1);
  }

  collect_ids(j, "eos_token_id", origin, h.eos_token_ids);
  std::vector<int32_t> bos;
  collect_ids(j, "bos_token_id", origin, bos);
  if (generation != nullptr) {
    const std::string gen_origin = directory + "/generation_config.json";
    check(generation->is_object(), "{}: expected a JSON object", gen_origin);
    collect_ids(*generation, "eos_token_id", gen_origin, h.eos_token_ids);
    if (bos.empty()) collect_ids(*generation, "bos_token_id", gen_origin, bos);
  }
  if (!bos.empty()) h.bos_token_id = bos[0];

  validate(c, origin);
  return h;
}

HfConfig read_hf_config(const std::string& directory) {
  const std::string path = directory + "/config.json";
  check(exists(path, false), "{}: no config.json (not a Hugging Face model directory)", directory);
  const json config = read_json_file(path);
  const std::string gen_path = directory + "/generation_config.json";
  if (exists(gen_path, false)) {
    const json generation = read_json_file(gen_path);
    return parse_hf_config(config, &generation, directory, path);
  }
  return parse_hf_config(config, nullptr, directory, path);
}

}  // namespace fdpp
