#include "engine/dispatch_table.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/cache_dir.h"
#include "core/read_file.h"
#include "fdpp/error.h"
#include "io/json_file.h"

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

}  // namespace

void validate_dispatch_ranges(const std::vector<DispatchRange>& r, const LinearLimits& limits, const std::string& where) {
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

std::vector<DispatchRange> merge_adjacent_ranges(std::vector<DispatchRange> r) {
  std::vector<DispatchRange> out;
  for (const DispatchRange& x : r)
    if (out.empty() || out.back().impl != x.impl) out.push_back(x);
  return out;
}

namespace {

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
    validate_dispatch_ranges(d.ranges, limits, where);
    d.ranges = merge_adjacent_ranges(d.ranges);
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
  const std::string text = read_file(path, kMaxJsonFileBytes, "the dispatch table");
  json j;
  try {
    j = parse_json(text);
  } catch (const JsonSyntaxError& e) {
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

}  // namespace fdpp
