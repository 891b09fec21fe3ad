#include "engine/dispatch_table.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/atomic_file.h"
#include "fdpp/error.h"
#include "core/cache_dir.h"

namespace fdpp {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "fdpp-linear-dispatch";
constexpr int kVersion = 1;
// A measured time above this many microseconds (100 s per GEMM) is a corrupt file, not a GPU.
constexpr double kMaxMicroseconds = 1e8;

[[noreturn]] void bad(const std::string& where, const std::string& why) {
  std::string w = why;
  std::replace(w.begin(), w.end(), '\n', ' ');
  fail("{}: {}", where, w);
}

const json& need(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) bad(where, "is not a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) bad(where, fmt::format("'{}' is missing", key));
  return *it;
}

// An integer-valued JSON number in [lo, hi], checked before any conversion (a huge or fractional
// value is an error, never a wrapped or truncated int).
int get_int(const json& v, const std::string& where, const char* key, int64_t lo, int64_t hi) {
  if (!v.is_number()) bad(where, fmt::format("{} = {} is not a number", key, v.dump()));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d)) bad(where, fmt::format("{} = {} is not an integer", key, v.dump()));
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad(where, fmt::format("{} = {} is not in [{}, {}]", key, v.dump(), lo, hi));
  return static_cast<int>(d);
}

std::string get_string(const json& v, const std::string& where, const char* key) {
  if (!v.is_string()) bad(where, fmt::format("{} = {} is not a string", key, v.dump()));
  return v.get<std::string>();
}

std::string shape_where(const std::string& table_where, int n, int k) {
  return fmt::format("{}, shape [{}, {}]", table_where, n, k);
}

// Checks ranges against the limits: the first from 1, strictly increasing, each implementation
// within its M limit, the last cuBLAS (the only one without a limit).
void validate_ranges(const std::vector<DispatchRange>& r, const LinearLimits& limits, const std::string& where) {
  if (r.empty()) bad(where, "no ranges");
  if (r.front().from_m != 1) bad(where, fmt::format("the first range starts at M = {}, not 1", r.front().from_m));
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].from_m < 1 || r[i].from_m > kDispatchMaxM)
      bad(where, fmt::format("range {} starts at M = {}, not in [1, {}]", i, r[i].from_m, kDispatchMaxM));
    if (i + 1 < r.size()) {
      if (r[i + 1].from_m <= r[i].from_m)
        bad(where, fmt::format("range {} starts at M = {}, not after range {} (M = {})", i + 1, r[i + 1].from_m, i,
                               r[i].from_m));
      const int last = r[i + 1].from_m - 1;
      if (last > limits.max_m(r[i].impl))
        bad(where, fmt::format("range {} runs {} up to M = {}, beyond its limit M = {}", i, linear_impl_name(r[i].impl),
                               last, limits.max_m(r[i].impl)));
    }
  }
  if (r.back().impl != LinearImpl::Cublas)
    bad(where, fmt::format("the last range (from M = {}) is {}, which cannot run every larger M: it must be cublas",
                           r.back().from_m, linear_impl_name(r.back().impl)));
}

std::vector<DispatchRange> merge_adjacent(std::vector<DispatchRange> r) {
  std::vector<DispatchRange> out;
  for (const DispatchRange& x : r)
    if (out.empty() || out.back().impl != x.impl) out.push_back(x);
  return out;
}

ShapeTimes parse_times(const json& m, const std::string& where) {
  ShapeTimes t;
  const json& ms = need(m, "m", where);
  if (!ms.is_array() || ms.empty()) bad(where, "measured.m is not a non-empty array");
  for (size_t i = 0; i < ms.size(); ++i) {
    const int v = get_int(ms[i], where, "measured.m[]", 1, kDispatchMaxM);
    if (!t.m.empty() && v <= t.m.back())
      bad(where, fmt::format("measured.m is not strictly increasing ({} after {})", v, t.m.back()));
    t.m.push_back(v);
  }
  for (LinearImpl impl : kAllLinearImpls) {
    const std::string key = fmt::format("{}_us", linear_impl_name(impl));
    auto& us = t.us[static_cast<int>(impl)];
    auto it = m.find(key);
    if (it == m.end()) {
      us.assign(t.m.size(), NAN);
      continue;
    }
    if (!it->is_array() || it->size() != t.m.size())
      bad(where, fmt::format("measured.{} is not an array of {} values (one per M)", key, t.m.size()));
    for (const json& v : *it) {
      if (v.is_null()) {
        us.push_back(NAN);
        continue;
      }
      if (!v.is_number()) bad(where, fmt::format("measured.{} holds {}, not a number or null", key, v.dump()));
      const double d = v.get<double>();
      if (!std::isfinite(d) || d <= 0 || d > kMaxMicroseconds)
        bad(where, fmt::format("measured.{} holds {}, not a time in (0, {}] us", key, v.dump(), kMaxMicroseconds));
      us.push_back(d);
    }
  }
  return t;
}

ShapeDispatch parse_shape(const json& s, const std::string& table_where, size_t index, const LinearLimits& limits) {
  const std::string idx_where = fmt::format("{}, shapes[{}]", table_where, index);
  ShapeDispatch d;
  d.n = get_int(need(s, "n", idx_where), idx_where, "n", 1, kDispatchMaxDim);
  d.k = get_int(need(s, "k", idx_where), idx_where, "k", 1, kDispatchMaxDim);
  const std::string where = shape_where(table_where, d.n, d.k);
  if (auto it = s.find("name"); it != s.end()) d.name = get_string(*it, where, "name");
  const auto r = s.find("ranges");
  const auto m1 = s.find("m1"), m2 = s.find("m2");
  if (r != s.end()) {
    if (!r->is_array()) bad(where, "ranges is not an array");
    for (size_t i = 0; i < r->size(); ++i) {
      const json& e = (*r)[i];
      const std::string rw = fmt::format("{}, ranges[{}]", where, i);
      DispatchRange x;
      x.from_m = get_int(need(e, "from", rw), rw, "from", 1, kDispatchMaxM);
      const std::string impl = get_string(need(e, "impl", rw), rw, "impl");
      const auto p = parse_linear_impl(impl);
      if (!p) bad(rw, fmt::format("impl '{}' is not one of gemv, flat, cublas", impl));
      x.impl = *p;
      d.ranges.push_back(x);
    }
    validate_ranges(d.ranges, limits, where);
    d.ranges = merge_adjacent(d.ranges);
    if (m1 != s.end() && get_int(*m1, where, "m1", 1, kDispatchMaxM) != d.m1())
      bad(where, fmt::format("m1 = {} disagrees with the ranges ({}), which give {}", m1->dump(), d.ranges_string(),
                             d.m1()));
    if (m2 != s.end() && get_int(*m2, where, "m2", 1, kDispatchMaxM) != d.m2())
      bad(where, fmt::format("m2 = {} disagrees with the ranges ({}), which give {}", m2->dump(), d.ranges_string(),
                             d.m2()));
  } else {
    if (m1 == s.end() || m2 == s.end()) bad(where, "neither 'ranges' nor both 'm1' and 'm2'");
    d.ranges = ranges_from_crossovers(get_int(*m1, where, "m1", 1, kDispatchMaxM),
                                      get_int(*m2, where, "m2", 1, kDispatchMaxM), limits, where);
  }
  if (auto it = s.find("measured"); it != s.end() && !it->is_null()) d.measured = parse_times(*it, where);
  return d;
}

ojson times_json(const ShapeTimes& t) {
  ojson j;
  j["m"] = t.m;
  for (LinearImpl impl : kAllLinearImpls) {
    ojson a = ojson::array();
    for (size_t i = 0; i < t.m.size(); ++i) {
      const double v = t.at(impl, i);
      if (std::isfinite(v)) a.push_back(std::round(v * 1000.0) / 1000.0);  // ns resolution is plenty
      else a.push_back(nullptr);
    }
    j[fmt::format("{}_us", linear_impl_name(impl))] = a;
  }
  return j;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string table_keys(const DispatchFile& f) {
  std::string s;
  for (const DispatchTable& t : f.tables) s += (s.empty() ? "" : "; ") + t.key();
  return s.empty() ? "no tables" : s;
}

}  // namespace

// ---- names and limits ----------------------------------------------------------------------------

const char* linear_impl_name(LinearImpl impl) {
  switch (impl) {
    case LinearImpl::Gemv: return "gemv";
    case LinearImpl::Flat: return "flat";
    case LinearImpl::Cublas: return "cublas";
  }
  return "?";
}

std::optional<LinearImpl> parse_linear_impl(std::string_view name) {
  for (LinearImpl impl : kAllLinearImpls)
    if (name == linear_impl_name(impl)) return impl;
  return std::nullopt;
}

int LinearLimits::max_m(LinearImpl impl) const {
  switch (impl) {
    case LinearImpl::Gemv: return gemv_max_m;
    case LinearImpl::Flat: return flat_max_m;
    case LinearImpl::Cublas: return std::numeric_limits<int>::max();
  }
  return 0;
}

// ---- one shape -----------------------------------------------------------------------------------

LinearImpl ShapeDispatch::choose(int M) const {
  for (auto it = ranges.rbegin(); it != ranges.rend(); ++it)
    if (M >= it->from_m) return it->impl;
  return LinearImpl::Cublas;  // M < 1 never reaches here (choose callers check), nor empty ranges
}

int ShapeDispatch::m1() const {
  for (const DispatchRange& r : ranges)
    if (r.impl != LinearImpl::Gemv) return r.from_m;
  return 1;
}

int ShapeDispatch::m2() const { return ranges.empty() ? 1 : ranges.back().from_m; }

std::string ShapeDispatch::ranges_string() const {
  std::string s;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const int a = ranges[i].from_m;
    std::string span;
    if (i + 1 == ranges.size()) span = fmt::format("{}+", a);
    else if (ranges[i + 1].from_m - 1 == a) span = fmt::format("{}", a);
    else span = fmt::format("{}-{}", a, ranges[i + 1].from_m - 1);
    s += fmt::format("{}{} {}", i ? " | " : "", span, linear_impl_name(ranges[i].impl));
  }
  return s;
}

const ShapeDispatch* DispatchTable::find(int n, int k) const {
  for (const ShapeDispatch& s : shapes)
    if (s.n == n && s.k == k) return &s;
  return nullptr;
}

std::string DispatchTable::key() const { return fmt::format("{} ({} SMs) {}", gpu, sm_count, dtype); }

const DispatchTable* DispatchFile::find(const std::string& gpu, int sm_count, const std::string& dtype) const {
  for (const DispatchTable& t : tables)
    if (t.gpu == gpu && t.sm_count == sm_count && t.dtype == dtype) return &t;
  return nullptr;
}

// ---- files ---------------------------------------------------------------------------------------

DispatchFile parse_dispatch_json(const json& j, const std::string& origin, const LinearLimits& limits) {
  DispatchFile f;
  f.path = origin;
  try {
    if (!j.is_object() || j.value("format", "") != kFormat)
      bad(origin, fmt::format("not an fdpp dispatch table (\"format\" must be \"{}\")", kFormat));
    const int version = get_int(need(j, "version", origin), origin, "version", 0, 1 << 30);
    if (version != kVersion) bad(origin, fmt::format("version {} (this fdpp reads {})", version, kVersion));
    const json& tables = need(j, "tables", origin);
    if (!tables.is_array() || tables.empty()) bad(origin, "'tables' is not a non-empty array");
    for (size_t ti = 0; ti < tables.size(); ++ti) {
      const json& t = tables[ti];
      const std::string tw0 = fmt::format("{}: tables[{}]", origin, ti);
      DispatchTable table;
      table.gpu = get_string(need(t, "gpu", tw0), tw0, "gpu");
      if (table.gpu.empty()) bad(tw0, "gpu is empty");
      table.sm_count = get_int(need(t, "sm_count", tw0), tw0, "sm_count", 1, 100000);
      table.dtype = get_string(need(t, "dtype", tw0), tw0, "dtype");
      if (table.dtype != "f16" && table.dtype != "bf16")
        bad(tw0, fmt::format("dtype '{}' is not one of f16, bf16", table.dtype));
      const std::string tw = fmt::format("{}: table {}", origin, table.key());
      if (f.find(table.gpu, table.sm_count, table.dtype) != nullptr) bad(tw, "appears twice");
      if (auto it = t.find("created_by"); it != t.end()) table.created_by = get_string(*it, tw, "created_by");
      if (auto it = t.find("tolerance"); it != t.end()) {
        if (!it->is_number() || !(it->get<double>() >= 0.0 && it->get<double>() <= 1.0))
          bad(tw, fmt::format("tolerance = {} is not a number in [0, 1]", it->dump()));
        table.tolerance = it->get<double>();
      }
      const json& shapes = need(t, "shapes", tw);
      if (!shapes.is_array()) bad(tw, "'shapes' is not an array");
      for (size_t si = 0; si < shapes.size(); ++si) {
        ShapeDispatch s = parse_shape(shapes[si], tw, si, limits);
        if (table.find(s.n, s.k) != nullptr) bad(shape_where(tw, s.n, s.k), "appears twice");
        table.shapes.push_back(std::move(s));
      }
      f.tables.push_back(std::move(table));
    }
  } catch (const json::exception& e) {
    bad(origin, e.what());
  }
  return f;
}

DispatchFile read_dispatch_file(const std::string& path, const LinearLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{}: cannot open the dispatch table", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    bad(path, fmt::format("not JSON ({})", e.what()));
  }
  return parse_dispatch_json(j, path, limits);
}

ojson dispatch_file_json(const DispatchFile& f, bool with_measurements) {
  ojson j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["comment"] =
      "fdpp linear-layer dispatch: per GPU, dtype and weight shape [n, k], the implementation for each M: "
      "ranges[i] runs from M = from until the next range's from. m1 = first M not on GEMV, m2 = cuBLAS from "
      "there on. Regenerate with fdpp tune (configs/dispatch/README.md).";
  ojson tables = ojson::array();
  for (const DispatchTable& t : f.tables) {
    ojson tj;
    tj["gpu"] = t.gpu;
    tj["sm_count"] = t.sm_count;
    tj["dtype"] = t.dtype;
    if (!t.created_by.empty()) tj["created_by"] = t.created_by;
    tj["tolerance"] = t.tolerance;
    ojson shapes = ojson::array();
    for (const ShapeDispatch& s : t.shapes) {
      ojson sj;
      if (!s.name.empty()) sj["name"] = s.name;
      sj["n"] = s.n;
      sj["k"] = s.k;
      sj["m1"] = s.m1();
      sj["m2"] = s.m2();
      ojson r = ojson::array();
      for (const DispatchRange& x : s.ranges) r.push_back({{"from", x.from_m}, {"impl", linear_impl_name(x.impl)}});
      sj["ranges"] = r;
      if (with_measurements && !s.measured.empty()) sj["measured"] = times_json(s.measured);
      shapes.push_back(sj);
    }
    tj["shapes"] = shapes;
    tables.push_back(tj);
  }
  j["tables"] = tables;
  return j;
}

void write_dispatch_file(DispatchFile& f, const std::string& path) {
  write_file_atomically(path, dispatch_file_json(f).dump(1) + "\n", "the dispatch table");
  f.path = path;
}

void merge_dispatch_table(DispatchFile& f, const DispatchTable& t) {
  for (DispatchTable& have : f.tables) {
    if (have.gpu != t.gpu || have.sm_count != t.sm_count || have.dtype != t.dtype) continue;
    for (const ShapeDispatch& s : t.shapes) {
      auto it = std::find_if(have.shapes.begin(), have.shapes.end(),
                             [&](const ShapeDispatch& x) { return x.n == s.n && x.k == s.k; });
      if (it != have.shapes.end()) *it = s;
      else have.shapes.push_back(s);
    }
    have.created_by = t.created_by;
    have.tolerance = t.tolerance;
    return;
  }
  f.tables.push_back(t);
}

// ---- building ranges -----------------------------------------------------------------------------

std::vector<DispatchRange> ranges_from_times(const ShapeTimes& t, double tolerance, const LinearLimits& limits) {
  const size_t n = t.m.size();
  check(n > 0, "dispatch: no measurements");
  check(tolerance >= 0 && tolerance <= 1, "dispatch: tolerance {} is not in [0, 1]", tolerance);
  for (LinearImpl impl : kAllLinearImpls)
    check(t.us[static_cast<int>(impl)].size() == n, "dispatch: {} times for {} values of M",
          t.us[static_cast<int>(impl)].size(), n);
  for (size_t i = 0; i < n; ++i)
    check(t.m[i] >= 1 && t.m[i] <= kDispatchMaxM && (i == 0 || t.m[i] > t.m[i - 1]),
          "dispatch: measured M values must increase within [1, {}] (M = {} at position {})", kDispatchMaxM, t.m[i], i);
  // acceptable[impl][i]: measured, within its limit, and within the tolerance of the fastest at m[i].
  std::vector<double> best(n, INFINITY);
  for (size_t i = 0; i < n; ++i) {
    for (LinearImpl impl : kAllLinearImpls) {
      const double v = t.at(impl, i);
      if (std::isfinite(v) && t.m[i] <= limits.max_m(impl)) best[i] = std::min(best[i], v);
    }
    check(std::isfinite(best[i]), "dispatch: no implementation was measured at M = {}", t.m[i]);
  }
  auto ok = [&](LinearImpl impl, size_t i) {
    const double v = t.at(impl, i);
    return std::isfinite(v) && t.m[i] <= limits.max_m(impl) && v <= best[i] * (1.0 + tolerance);
  };
  struct Segment {
    size_t first;
    LinearImpl impl;
  };
  std::vector<Segment> segs;
  for (size_t i = 0; i < n;) {
    LinearImpl pick = LinearImpl::Cublas;
    size_t reach = 0;  // one past the last index pick stays acceptable at
    for (LinearImpl impl : kAllLinearImpls) {
      if (!ok(impl, i)) continue;
      size_t j = i;
      while (j < n && ok(impl, j)) ++j;
      if (j > reach || (j == reach && t.at(impl, i) < t.at(pick, i))) {
        reach = j;
        pick = impl;
      }
    }
    segs.push_back({i, pick});
    i = reach;
  }
  // Measured indices -> M ranges. A segment's choice continues past its last measured M up to the
  // next segment's first measured M, but never beyond its own limit: the next segment then starts
  // earlier (it can take any M below the ones it was measured at).
  std::vector<DispatchRange> r;
  for (size_t s = 0; s < segs.size(); ++s) {
    int from = s == 0 ? 1 : t.m[segs[s].first];
    if (s > 0 && segs[s - 1].impl != LinearImpl::Cublas) from = std::min(from, limits.max_m(segs[s - 1].impl) + 1);
    r.push_back({from, segs[s].impl});
  }
  if (r.back().impl != LinearImpl::Cublas) r.push_back({limits.max_m(r.back().impl) + 1, LinearImpl::Cublas});
  return merge_adjacent(r);
}

std::vector<DispatchRange> ranges_from_crossovers(int m1, int m2, const LinearLimits& limits,
                                                  const std::string& origin) {
  if (m1 < 1 || m1 > limits.gemv_max_m + 1)
    bad(origin, fmt::format("m1 = {} is not in [1, {}] (GEMV runs M < m1, up to {})", m1, limits.gemv_max_m + 1,
                            limits.gemv_max_m));
  if (m2 < m1 || m2 > limits.flat_max_m + 1)
    bad(origin, fmt::format("m2 = {} is not in [m1 = {}, {}] (flat GEMM runs m1 <= M < m2, up to {})", m2, m1,
                            limits.flat_max_m + 1, limits.flat_max_m));
  std::vector<DispatchRange> r;
  if (m1 > 1) r.push_back({1, LinearImpl::Gemv});
  if (m2 > m1) r.push_back({m1, LinearImpl::Flat});
  r.push_back({m2, LinearImpl::Cublas});
  return r;
}

// ---- the rule without a table ------------------------------------------------------------------
//
// GEMV for M <= kFallbackGemvMaxM = 1: measured on the H200 (Llama-2-7B fp16, ctx 1024, ms per
// decode step, GEMV vs cuBLASLt in one run, docs/performance-log.md run 5): M=1 4.313 vs 4.466 (GEMV
// wins), M=2 5.000 vs 4.688 (loses), M=4 6.105 vs 5.093, M=8 8.573 vs 5.431. GEMV re-reads nothing
// but its time grows with M (each weight is multiplied by M rows on CUDA cores).
//
// Flat GEMM for 2 <= M <= kFallbackFlatMaxM = 16: not measured yet (to be set by fdpp tune on the
// H200). The reasons it is the better guess than cuBLAS there: the kernel pads M to 8 instead of
// 64, so up to M = 16 it runs at most two 8-wide MMA columns and stays a pure weight stream, the
// regime it is designed for; cuBLASLt at these M reaches only 50-86% of the read bandwidth on the
// Llama-2-7B shapes (DESIGN.md "Measuring": O [4096,4096] 50%, down [4096,11008] 67% at M = 1,
// "nearly flat up to M = 128"), leaving the margin flat GEMM targets. Above 16 the arithmetic grows
// toward where cuBLAS's larger tiles are made for, and the paper's measured crossovers M2 sit in
// the tens, so cuBLAS is the safer default there. A table replaces all of this per shape.
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
  const bool swiglu = c.activation == Activation::SwiGLU;
  std::vector<LinearShape> s{{"qkv", Q + 2 * KV, H},
                             {"o", H, Q},
                             {swiglu ? "gate_up" : "fc1", swiglu ? 2 * FF : FF, H},
                             {swiglu ? "down" : "fc2", H, FF}};
  if (include_lm_head) s.push_back({"lm_head", c.vocab_size, H});
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

// ---- paths ---------------------------------------------------------------------------------------

std::string dispatch_path_beside(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return (fs::path(model_path) / "fdpp-dispatch.json").string();
  return model_path + ".fdpp-dispatch.json";
}

std::string dispatch_cache_dir() { return (fs::path(cache_dir()) / "dispatch").string(); }

std::string gpu_slug(const std::string& gpu) {
  std::string s;
  for (char ch : gpu) {
    const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (alnum) s += ch;
    else if (ch >= 'A' && ch <= 'Z') s += static_cast<char>(ch - 'A' + 'a');
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s.empty() ? "gpu" : s;
}

std::string dispatch_path_in_cache(const std::string& gpu, int sm_count) {
  return (fs::path(dispatch_cache_dir()) / fmt::format("{}-{}sm.fdpp-dispatch.json", gpu_slug(gpu), sm_count)).string();
}

std::string repo_configs_dir() {
  // Binaries run from a build directory inside the checkout (build-gpu/fdpp: ../configs), also on
  // the GPU machine where the checkout lives elsewhere than where it was compiled; the source tree
  // compiled in (FDPP_SOURCE_DIR) is the last resort.
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) {
    candidates.push_back(exe.parent_path() / "configs");
    candidates.push_back(exe.parent_path().parent_path() / "configs");
  }
#ifdef FDPP_SOURCE_DIR
  candidates.push_back(fs::path(FDPP_SOURCE_DIR) / "configs");
#endif
  for (const fs::path& c : candidates)
    if (fs::is_directory(c, ec)) return c.lexically_normal().string();
  return {};
}

std::string preset_config_path(const std::string& name) {
  check(!name.empty(), "--preset: empty name");
  std::error_code ec;
  if (name.ends_with(".json")) {
    check(fs::is_regular_file(name, ec), "--preset {}: no such file", name);
    return name;
  }
  const std::string dir = repo_configs_dir();
  check(!dir.empty(), "--preset {}: the configs/ directory of the repository was not found", name);
  const fs::path p = fs::path(dir) / (name + ".json");
  if (fs::is_regular_file(p, ec)) return p.string();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  fail("--preset {}: no {}/{}.json (presets: {})", name, dir, name, list.empty() ? "none" : list);
}

// ---- the chooser ---------------------------------------------------------------------------------

void LinearChooser::add_table(const DispatchTable& table, const std::string& origin) {
  for (const ShapeDispatch& s : table.shapes)
    validate_ranges(s.ranges, limits_, shape_where(origin + ": table " + table.key(), s.n, s.k));
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
  } else if (const std::string e = o.use_environment ? env_or_empty("FDPP_LINEAR") : ""; !e.empty()) {
    c.mode_ = parse_linear_mode(e, "FDPP_LINEAR");
    if (c.mode_ != LinearMode::Auto) c.mode_origin_ = "FDPP_LINEAR=" + e;
  }
  if (c.mode_ == LinearMode::Auto) {
    if (o.gemv_max_m >= 0) {
      c.set_gemv_max_m(o.gemv_max_m);
    } else if (const std::string e = o.use_environment ? env_or_empty("FDPP_GEMV_MAX_M") : ""; !e.empty()) {
      int v = -1;
      const char* end = e.data() + e.size();
      auto [p, ec] = std::from_chars(e.data(), end, v);
      check(ec == std::errc() && p == end && v >= 0 && v <= limits.gemv_max_m,
            "FDPP_GEMV_MAX_M={} is not an integer in [0, {}]", e, limits.gemv_max_m);
      c.set_gemv_max_m(v);
    }
  }

  // The tables, in lookup order.
  std::error_code ec;
  const std::string explicit_path =
      !o.table_path.empty() ? o.table_path : (o.use_environment ? env_or_empty("FDPP_DISPATCH_TABLE") : "");
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
