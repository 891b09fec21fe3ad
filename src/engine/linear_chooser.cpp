#include "engine/linear_chooser.h"

#include <algorithm>
#include <filesystem>

#include "fdpp/error.h"

namespace fdpp {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::string table_keys(const DispatchFile& f) {
  std::string s;
  for (const DispatchTable& t : f.tables) s += (s.empty() ? "" : "; ") + t.key();
  return s.empty() ? "no tables" : s;
}

}  // namespace

// ---- the rule without a table ------------------------------------------------------------------
//
// GEMV for M <= kFallbackGemvMaxM = 1: measured on the H200 (Llama-2-7B fp16, ctx 1024, ms per
// decode step, GEMV vs cuBLASLt in one run, docs/performance-log.md run 5): M=1 4.313 vs 4.466 (GEMV
// wins), M=2 5.000 vs 4.688 (loses), M=4 6.105 vs 5.093, M=8 8.573 vs 5.431. GEMV re-reads nothing
// but its time grows with M (each weight is multiplied by M rows on CUDA cores).
//
// Flat GEMM for 2 <= M <= kFallbackFlatMaxM = 16. The rule only serves shapes no table covers
// (other models, other GPUs); the shapes measured on the H200 are decided by the tables fdpp tune
// wrote, configs/dispatch/h200-*.json (configs/dispatch/README.md; `fdpp info` prints each shape's
// M1 and M2). On those shapes flat GEMM runs nowhere past M = 16, and below it flat GEMM and
// cuBLASLt split the shapes, so no single choice fits them all. Flat GEMM is the guess there because
// the kernel pads M to 8 instead of 64: up to M = 16 it runs at most two 8-wide MMA columns and stays
// a pure weight stream, the regime it is designed for, and on the Llama-2-7B shapes it beat
// cuBLASLt on QKV and O at M = 1..8 and lost on down (bench/kernels/NOTES.md, the shape table).
// Above 16 the arithmetic grows toward where cuBLAS's larger tiles are made for, so cuBLAS is the
// safer default there.
LinearImpl fallback_choice(int M, const LinearLimits& limits) {
  if (M <= std::min(kFallbackGemvMaxM, limits.gemv_max_m)) return LinearImpl::Gemv;
  if (M <= std::min(kFallbackFlatMaxM, limits.flat_max_m)) return LinearImpl::Flat;
  return LinearImpl::Cublas;
}

LinearMode parse_linear_mode(const std::string& value, const std::string& origin) {
  if (value == "auto" || value.empty()) return LinearMode::Auto;
  if (value == "gemv") return LinearMode::Gemv;
  if (value == "flat") return LinearMode::Flat;
  if (value == "cublas") return LinearMode::Cublas;
  fail("{}='{}' is not one of auto, gemv, flat, cublas", origin, value);
}

const char* linear_mode_name(LinearMode mode) {
  switch (mode) {
    case LinearMode::Auto: return "auto";
    case LinearMode::Gemv: return "gemv";
    case LinearMode::Flat: return "flat";
    case LinearMode::Cublas: return "cublas";
  }
  return "?";
}

LinearImpl forced_choice(LinearImpl wanted, int M, const LinearLimits& limits) {
  if (wanted == LinearImpl::Gemv && M > limits.gemv_max_m) wanted = LinearImpl::Flat;
  if (wanted == LinearImpl::Flat && M > limits.flat_max_m) wanted = LinearImpl::Cublas;
  return wanted;
}

// ---- model shapes --------------------------------------------------------------------------------

std::vector<LinearShape> model_linear_shapes(const ModelConfig& c, bool include_lm_head) {
  const int H = c.hidden, Q = c.q_dim(), KV = c.kv_dim(), FF = c.ffn_hidden;
  const bool swiglu = c.activation == Activation::SwiGLU || c.activation == Activation::GeGLU;  // gated: one gate/up
  std::vector<LinearShape> s{{"qkv", Q + 2 * KV, H},
                             {"o", H, Q},
                             {swiglu ? "gate_up" : "fc1", swiglu ? 2 * FF : FF, H},
                             {swiglu ? "down" : "fc2", H, FF}};
  if (c.embedding_dim() != H) {  // OPT-350m's projections around the layers
    s.push_back({"project_in", H, c.embedding_dim()});
    s.push_back({"project_out", c.embedding_dim(), H});
  }
  if (c.has_moe()) s.push_back({"router", c.n_experts, H});
  if (include_lm_head) s.push_back({"lm_head", c.vocab_size, c.embedding_dim()});
  return s;
}

std::vector<LinearShape> unique_linear_shapes(std::span<const LinearShape> shapes) {
  std::vector<LinearShape> out;
  for (const LinearShape& s : shapes) {
    auto it = std::find_if(out.begin(), out.end(), [&](const LinearShape& x) { return x.n == s.n && x.k == s.k; });
    if (it == out.end()) out.push_back(s);
    else it->name += "+" + s.name;
  }
  return out;
}

// ---- the chooser ---------------------------------------------------------------------------------

void LinearChooser::add_table(const DispatchTable& table, const std::string& origin) {
  for (const ShapeDispatch& s : table.shapes)
    validate_dispatch_ranges(s.ranges, limits_, fmt::format("{}: table {}, shape [{}, {}]", origin, table.key(), s.n, s.k));
  sources_.push_back({origin, table});
}

void LinearChooser::set_gemv_max_m(int m) {
  check(m >= -1 && m <= limits_.gemv_max_m, "GEMV max M {} is not in [0, {}]", m, limits_.gemv_max_m);
  gemv_max_m_ = m;
}

LinearChooser LinearChooser::load(const DispatchSelectOptions& o, const std::string& gpu, int sm_count,
                                  const std::string& dtype, const LinearLimits& limits) {
  LinearChooser c;
  c.limits_ = limits;
  c.key_ = fmt::format("{} ({} SMs) {}", gpu, sm_count, dtype);
  check(dtype == "f16" || dtype == "bf16", "dispatch: dtype '{}' is not one of f16, bf16", dtype);

  // The mode and the GEMV threshold.
  if (!o.mode.empty()) {
    c.mode_ = parse_linear_mode(o.mode, "linear mode");
    if (c.mode_ != LinearMode::Auto) c.mode_origin_ = fmt::format("linear mode {}", o.mode);
  }
  if (c.mode_ == LinearMode::Auto && o.gemv_max_m >= 0) c.set_gemv_max_m(o.gemv_max_m);

  // The tables, in lookup order.
  std::error_code ec;
  const std::string& explicit_path = o.table_path;
  if (!explicit_path.empty()) {
    const DispatchFile f = read_dispatch_file(explicit_path, limits);
    const DispatchTable* t = f.find(gpu, sm_count, dtype);
    check(t != nullptr, "{}: no dispatch table for {} (the file has: {}); run fdpp tune on this GPU", explicit_path,
          c.key_, table_keys(f));
    c.add_table(*t, explicit_path);
  }
  auto optional_file = [&](const std::string& path, const char* where) {
    if (path.empty() || !fs::exists(path, ec)) return;
    const DispatchFile f = read_dispatch_file(path, limits);
    if (const DispatchTable* t = f.find(gpu, sm_count, dtype)) {
      c.add_table(*t, fmt::format("{} ({})", path, where));
    } else {
      c.notes_.push_back(fmt::format("{} ({}) skipped: no table for this GPU and dtype (it has: {})", path, where,
                                     table_keys(f)));
    }
  };
  if (!o.model_path.empty()) optional_file(dispatch_path_beside(o.model_path), "beside the model");
  if (o.search_cache) optional_file(dispatch_path_in_cache(gpu, sm_count), "cache");
  if (o.search_shipped) {
    const std::string configs = repo_configs_dir();
    const fs::path dir = configs.empty() ? fs::path() : fs::path(configs) / "dispatch";
    if (!dir.empty() && fs::is_directory(dir, ec)) {
      std::vector<std::string> files;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".json") files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
      for (const std::string& p : files) {
        const DispatchFile f = read_dispatch_file(p, limits);
        if (const DispatchTable* t = f.find(gpu, sm_count, dtype)) c.add_table(*t, p + " (shipped)");
      }
    }
  }
  return c;
}

const ShapeDispatch* LinearChooser::find(int N, int K, std::string* origin) const {
  for (const Source& s : sources_)
    if (const ShapeDispatch* d = s.table.find(N, K)) {
      if (origin != nullptr) *origin = s.origin;
      return d;
    }
  return nullptr;
}

LinearImpl LinearChooser::choose(int M, int N, int K) const {
  check(M >= 1 && N >= 1 && K >= 1, "linear dispatch: bad shape M={} N={} K={}", M, N, K);
  switch (mode_) {
    case LinearMode::Gemv: return forced_choice(LinearImpl::Gemv, M, limits_);
    case LinearMode::Flat: return forced_choice(LinearImpl::Flat, M, limits_);
    case LinearMode::Cublas: return LinearImpl::Cublas;
    case LinearMode::Auto: break;
  }
  if (gemv_max_m_ >= 0 && M <= gemv_max_m_) return LinearImpl::Gemv;
  const ShapeDispatch* d = find(N, K);
  LinearImpl impl = d != nullptr ? d->choose(M) : fallback_choice(M, limits_);
  // An explicit GEMV threshold also means no GEMV above it.
  if (gemv_max_m_ >= 0 && impl == LinearImpl::Gemv) impl = forced_choice(LinearImpl::Flat, M, limits_);
  return impl;
}

std::vector<DispatchRange> LinearChooser::effective_ranges(int N, int K) const {
  // choose() is piecewise constant in M; it can only change where a range of the deciding table
  // starts or just above one of the limits and thresholds, so evaluating it there is exact.
  std::vector<int> at{1, limits_.gemv_max_m + 1, limits_.flat_max_m + 1, kFallbackGemvMaxM + 1,
                      kFallbackFlatMaxM + 1};
  if (gemv_max_m_ >= 0) at.push_back(gemv_max_m_ + 1);
  if (const ShapeDispatch* d = find(N, K))
    for (const DispatchRange& r : d->ranges) at.push_back(r.from_m);
  std::sort(at.begin(), at.end());
  std::vector<DispatchRange> r;
  for (int M : at) {
    if (M < 1 || (!r.empty() && M <= r.back().from_m)) continue;
    const LinearImpl impl = choose(M, N, K);
    if (r.empty() || r.back().impl != impl) r.push_back({M, impl});
  }
  return r;
}

std::string LinearChooser::describe(std::span<const LinearShape> shapes) const {
  std::string s = fmt::format("{}, mode {}", key_.empty() ? "(no GPU named)" : key_, linear_mode_name(mode_));
  if (!mode_origin_.empty()) s += fmt::format(" ({}; gemv/flat beyond their max M run the next one up)", mode_origin_);
  if (gemv_max_m_ >= 0) s += fmt::format(", GEMV for exactly M <= {}", gemv_max_m_);
  if (sources_.empty()) {
    s += "; no table: the fallback rule";
  } else {
    s += "; tables:";
    for (const Source& x : sources_) s += " " + x.origin;
  }
  for (const std::string& n : notes_) s += "\n" + n;
  for (const LinearShape& sh : shapes) {
    std::string origin;
    const ShapeDispatch* d = find(sh.n, sh.k, &origin);
    ShapeDispatch use;
    use.ranges = effective_ranges(sh.n, sh.k);
    std::string why;
    if (mode_ != LinearMode::Auto) why = "  (forced)";
    else if (d == nullptr) why = "  (fallback rule: no table for this shape)";
    else if (sources_.size() > 1) why = "  (" + origin + ")";
    s += fmt::format("\n{:<8} [{}, {}]  M1 {:<3} M2 {:<4} {}{}", sh.name, sh.n, sh.k, use.m1(), use.m2(),
                     use.ranges_string(), why);
  }
  return s;
}

ojson LinearChooser::describe_json(std::span<const LinearShape> shapes) const {
  ojson j;
  j["device"] = key_;
  j["mode"] = linear_mode_name(mode_);
  if (!mode_origin_.empty()) j["forced_by"] = mode_origin_;
  if (gemv_max_m_ >= 0) j["gemv_max_m"] = gemv_max_m_;
  ojson src = ojson::array();
  for (const Source& x : sources_) src.push_back(x.origin);
  j["tables"] = src;
  j["skipped"] = notes_;
  ojson sj = ojson::array();
  for (const LinearShape& sh : shapes) {
    std::string origin;
    const ShapeDispatch* d = find(sh.n, sh.k, &origin);
    ShapeDispatch use;
    use.ranges = effective_ranges(sh.n, sh.k);
    sj.push_back({{"name", sh.name},
                  {"n", sh.n},
                  {"k", sh.k},
                  {"m1", use.m1()},
                  {"m2", use.m2()},
                  {"ranges", use.ranges_string()},
                  {"source", mode_ != LinearMode::Auto ? "forced" : d != nullptr ? origin : "fallback rule"}});
  }
  j["shapes"] = sj;
  return j;
}

}  // namespace fdpp
