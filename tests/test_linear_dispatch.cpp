// The CUDA-free half of the heuristic dataflow (engine/dispatch_table.h): dispatch-table JSON
// round trips and one-line errors for malformed or mismatched tables, ranges built from
// measurements (within the tolerance of the fastest at every measured M, curves that cross more
// than once), choose() at and around crossovers, forced modes, the fallback rule, the lookup order
// of table files, and the model shapes the CUDA backend runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <tuple>
#include <filesystem>
#include <optional>

#include "backend/cuda/linear_tuning.h"
#include "engine/dispatch_table.h"
#include "runtime/environment_fallback.h"
#include "engine/linear_chooser.h"
#include "model/hf_config.h"
#include "test_util.h"
#include "tune_table.h"

namespace fdpp {
namespace {

using json = nlohmann::json;
constexpr LinearImpl G = LinearImpl::Gemv, F = LinearImpl::Flat, C = LinearImpl::Cublas;

// Sets an environment variable for one scope and restores the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

ShapeDispatch shape(const char* name, int n, int k, std::vector<DispatchRange> ranges) {
  ShapeDispatch s;
  s.name = name;
  s.n = n;
  s.k = k;
  s.ranges = std::move(ranges);
  return s;
}

DispatchTable test_table(const std::string& gpu = "Test GPU", const std::string& dtype = "f16") {
  DispatchTable t;
  t.gpu = gpu;
  t.sm_count = 132;
  t.dtype = dtype;
  t.created_by = "test";
  t.tolerance = 0.02;
  // A curve pair that crosses three times: flat, cuBLAS, flat again, cuBLAS.
  t.shapes.push_back(shape("qkv", 12288, 4096, {{1, G}, {2, F}, {25, C}, {33, F}, {65, C}}));
  t.shapes.push_back(shape("o", 4096, 4096, {{1, F}, {17, C}}));
  ShapeTimes m;
  m.m = {1, 2, 64, 4096};
  m.us[0] = {10.5, 12.25, NAN, NAN};
  m.us[1] = {11.0, 11.5, 13.125, NAN};
  m.us[2] = {14.0, 14.0, 14.5, 900.0};
  t.shapes.back().measured = m;
  return t;
}

// The JSON of a valid one-table file, for the malformed-file cases to break.
json valid_json() {
  DispatchFile f;
  f.tables.push_back(test_table());
  return json::parse(dispatch_file_json(f).dump());
}

std::string parse_error(const json& j) {
  return test::error_of([&] { parse_dispatch_json(j, "T.json"); });
}

TEST(LinearDispatch, NamesAndLimits) {
  for (LinearImpl impl : kAllLinearImpls) EXPECT_EQ(parse_linear_impl(linear_impl_name(impl)), impl);
  EXPECT_FALSE(parse_linear_impl("cutlass").has_value());
  const LinearLimits l;
  EXPECT_EQ(l.max_m(G), 8);
  EXPECT_EQ(l.max_m(F), 64);
  EXPECT_GT(l.max_m(C), 1 << 30);
  EXPECT_EQ(gpu_slug("NVIDIA H200"), "nvidia-h200");
  EXPECT_EQ(gpu_slug("  NVIDIA GeForce RTX 4090 (x) "), "nvidia-geforce-rtx-4090-x");
  EXPECT_EQ(gpu_slug("///"), "gpu");
}

TEST(LinearDispatch, JsonRoundTrip) {
  DispatchFile f;
  f.tables.push_back(test_table());
  f.tables.push_back(test_table("Test GPU", "bf16"));
  f.tables.push_back(test_table("Other GPU", "f16"));
  const DispatchFile g = parse_dispatch_json(json::parse(dispatch_file_json(f).dump()), "mem");
  ASSERT_EQ(g.tables.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    const DispatchTable &a = f.tables[t], &b = g.tables[t];
    EXPECT_EQ(a.key(), b.key());
    EXPECT_EQ(a.created_by, b.created_by);
    EXPECT_DOUBLE_EQ(a.tolerance, b.tolerance);
    ASSERT_EQ(a.shapes.size(), b.shapes.size());
    for (size_t s = 0; s < a.shapes.size(); ++s) {
      EXPECT_EQ(a.shapes[s].name, b.shapes[s].name);
      EXPECT_EQ(a.shapes[s].n, b.shapes[s].n);
      EXPECT_EQ(a.shapes[s].k, b.shapes[s].k);
      EXPECT_EQ(a.shapes[s].ranges, b.shapes[s].ranges);
      EXPECT_EQ(a.shapes[s].measured.m, b.shapes[s].measured.m);
      for (int i = 0; i < kLinearImpls; ++i) {
        ASSERT_EQ(a.shapes[s].measured.us[i].size(), b.shapes[s].measured.us[i].size());
        for (size_t j = 0; j < a.shapes[s].measured.us[i].size(); ++j) {
          const double x = a.shapes[s].measured.us[i][j], y = b.shapes[s].measured.us[i][j];
          if (std::isnan(x)) EXPECT_TRUE(std::isnan(y));
          else EXPECT_DOUBLE_EQ(x, y);  // the test values are exact at ns resolution
        }
      }
    }
  }
  // m1 / m2 are written beside the ranges.
  const auto j = dispatch_file_json(f);
  EXPECT_EQ(j["tables"][0]["shapes"][0]["m1"], 2);
  EXPECT_EQ(j["tables"][0]["shapes"][0]["m2"], 65);
  EXPECT_EQ(g.find("Test GPU", 132, "bf16"), &g.tables[1]);
  EXPECT_EQ(g.find("Test GPU", 108, "f16"), nullptr);

  // Through a file (atomic write into a new directory).
  const auto dir = test::scratch_dir("dispatch_rt");
  const std::string path = (dir / "sub" / "t.json").string();
  write_dispatch_file(f, path);
  EXPECT_EQ(f.path, path);
  const DispatchFile h = read_dispatch_file(path);
  EXPECT_EQ(h.path, path);
  ASSERT_EQ(h.tables.size(), 3u);
  EXPECT_EQ(h.tables[0].shapes[0].ranges_string(), "1 gemv | 2-24 flat | 25-32 cublas | 33-64 flat | 65+ cublas");
  std::filesystem::remove_all(dir);
}

TEST(LinearDispatch, TwoCrossoverForm) {
  json j = valid_json();
  auto& s = j["tables"][0]["shapes"][0];
  s.erase("ranges");
  s["m1"] = 3;
  s["m2"] = 20;
  const DispatchFile f = parse_dispatch_json(j, "T.json");
  EXPECT_EQ(f.tables[0].shapes[0].ranges, (std::vector<DispatchRange>{{1, G}, {3, F}, {20, C}}));
  // Degenerate forms: no GEMV, no flat.
  EXPECT_EQ(ranges_from_crossovers(1, 1), (std::vector<DispatchRange>{{1, C}}));
  EXPECT_EQ(ranges_from_crossovers(1, 65), (std::vector<DispatchRange>{{1, F}, {65, C}}));
  EXPECT_EQ(ranges_from_crossovers(9, 9), (std::vector<DispatchRange>{{1, G}, {9, C}}));
}

TEST(LinearDispatch, MalformedTablesAreOneLineErrors) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* expect;
  };
  auto shape0 = [](json& j) -> json& { return j["tables"][0]["shapes"][0]; };
  const std::vector<Case> cases = {
      {"format", [](json& j) { j["format"] = "something"; }, "not an fdpp dispatch table"},
      {"version", [](json& j) { j["version"] = 7; }, "version 7"},
      {"no tables", [](json& j) { j.erase("tables"); }, "'tables' is missing"},
      {"empty tables", [](json& j) { j["tables"] = json::array(); }, "non-empty array"},
      {"no gpu", [](json& j) { j["tables"][0].erase("gpu"); }, "'gpu' is missing"},
      {"empty gpu", [](json& j) { j["tables"][0]["gpu"] = ""; }, "gpu is empty"},
      {"gpu not a string", [](json& j) { j["tables"][0]["gpu"] = 5; }, "gpu = 5 is not a string"},
      {"dtype", [](json& j) { j["tables"][0]["dtype"] = "fp8"; }, "dtype 'fp8' is not one of f16, bf16"},
      {"negative SMs", [](json& j) { j["tables"][0]["sm_count"] = -1; }, "sm_count = -1 is not in [1, 100000]"},
      {"huge n", [&](json& j) { shape0(j)["n"] = 1e30; }, "n = 1e+30 is not in [1, 16777216]"},
      {"fractional k", [&](json& j) { shape0(j)["k"] = 4096.5; }, "k = 4096.5 is not an integer"},
      {"n missing", [&](json& j) { shape0(j).erase("n"); }, "shapes[0]: 'n' is missing"},
      {"negative M", [&](json& j) { shape0(j)["ranges"][1]["from"] = -3; }, "from = -3 is not in [1, 1048576]"},
      {"huge M", [&](json& j) { shape0(j)["ranges"][4]["from"] = 1e12; }, "is not in [1, 1048576]"},
      {"first range", [&](json& j) { shape0(j)["ranges"][0]["from"] = 2; }, "the first range starts at M = 2, not 1"},
      {"order", [&](json& j) { shape0(j)["ranges"][2]["from"] = 2; }, "range 2 starts at M = 2, not after range 1"},
      {"gemv beyond its limit",
       [&](json& j) { shape0(j)["ranges"][1]["from"] = 12; }, "range 0 runs gemv up to M = 11, beyond its limit M = 8"},
      {"flat beyond its limit",
       [&](json& j) { shape0(j)["ranges"][4]["from"] = 100; }, "runs flat up to M = 99, beyond its limit M = 64"},
      {"last not cublas", [&](json& j) { shape0(j)["ranges"].erase(4); }, "must be cublas"},
      {"unknown impl", [&](json& j) { shape0(j)["ranges"][0]["impl"] = "tensorrt"; }, "impl 'tensorrt' is not one of"},
      {"range not an object", [&](json& j) { shape0(j)["ranges"][0] = 3; }, "is not a JSON object"},
      {"m1 disagrees", [&](json& j) { shape0(j)["m1"] = 3; }, "m1 = 3 disagrees with the ranges"},
      {"m2 disagrees", [&](json& j) { shape0(j)["m2"] = 17; }, "m2 = 17 disagrees with the ranges"},
      {"neither", [&](json& j) { shape0(j).erase("ranges"); shape0(j).erase("m2"); }, "neither 'ranges' nor both"},
      {"m1 too large",
       [&](json& j) { shape0(j).erase("ranges"); shape0(j)["m1"] = 10; shape0(j)["m2"] = 12; }, "m1 = 10 is not in [1, 9]"},
      {"m2 below m1",
       [&](json& j) { shape0(j).erase("ranges"); shape0(j)["m1"] = 5; shape0(j)["m2"] = 4; }, "m2 = 4 is not in [m1 = 5, 65]"},
      {"shape twice", [](json& j) { j["tables"][0]["shapes"].push_back(j["tables"][0]["shapes"][0]); }, "appears twice"},
      {"table twice", [](json& j) { j["tables"].push_back(j["tables"][0]); }, "table Test GPU (132 SMs) f16: appears twice"},
      {"measured length", [](json& j) { j["tables"][0]["shapes"][1]["measured"]["flat_us"].erase(0); }, "one per M"},
      {"negative time", [](json& j) { j["tables"][0]["shapes"][1]["measured"]["cublas_us"][0] = -1; }, "not a time"},
      {"time not a number", [](json& j) { j["tables"][0]["shapes"][1]["measured"]["gemv_us"][0] = "x"; }, "not a number"},
      {"measured M order", [](json& j) { j["tables"][0]["shapes"][1]["measured"]["m"][1] = 1; }, "not strictly increasing"},
      {"tolerance", [](json& j) { j["tables"][0]["tolerance"] = -0.5; }, "tolerance = -0.5"},
  };
  for (const Case& c : cases) {
    json j = valid_json();
    c.edit(j);
    const std::string msg = parse_error(j);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(msg.rfind("T.json", 0), 0u) << c.what << ": the message names the file: " << msg;
  }
  // Files: missing, not JSON.
  const auto dir = test::scratch_dir("dispatch_bad");
  EXPECT_NE(test::error_of([&] { read_dispatch_file((dir / "none.json").string()); }).find("cannot open"),
            std::string::npos);
  test::write_text(dir / "bad.json", "{ not json");
  const std::string msg = test::error_of([&] { read_dispatch_file((dir / "bad.json").string()); });
  EXPECT_NE(msg.find("bad.json: not JSON"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(LinearDispatch, ChooseFollowsTheTableAroundCrossovers) {
  LinearChooser c;
  c.add_table(test_table(), "mem");
  // qkv: 1 gemv | 2-24 flat | 25-32 cublas | 33-64 flat | 65+ cublas, at and on both sides of each.
  const std::vector<std::pair<int, LinearImpl>> qkv = {{1, G},  {2, F},  {3, F},  {24, F}, {25, C}, {26, C},
                                                       {32, C}, {33, F}, {34, F}, {64, F}, {65, C}, {66, C},
                                                       {4096, C}, {1 << 20, C}};
  for (auto [m, want] : qkv) EXPECT_EQ(c.choose(m, 12288, 4096), want) << "M " << m;
  for (int m = 1; m <= 16; ++m) EXPECT_EQ(c.choose(m, 4096, 4096), F) << "o, M " << m;
  for (int m = 17; m <= 200; ++m) EXPECT_EQ(c.choose(m, 4096, 4096), C) << "o, M " << m;
  // A shape no table has: the fallback rule.
  for (int m = 1; m <= 100; ++m) EXPECT_EQ(c.choose(m, 4096, 11008), fallback_choice(m)) << "M " << m;
  EXPECT_NE(test::error_of([&] { c.choose(0, 4096, 4096); }).find("bad shape M=0"), std::string::npos);
  EXPECT_NE(test::error_of([&] { c.choose(1, -4, 4096); }).find("bad shape"), std::string::npos);
  // The first table that has a shape decides it.
  DispatchTable later = test_table();
  later.shapes = {shape("o", 4096, 4096, {{1, C}}), shape("down", 4096, 11008, {{1, G}, {3, C}})};
  c.add_table(later, "later");
  EXPECT_EQ(c.choose(1, 4096, 4096), F);
  EXPECT_EQ(c.choose(2, 4096, 11008), G);
  EXPECT_EQ(c.choose(3, 4096, 11008), C);
  std::string origin;
  ASSERT_NE(c.find(4096, 11008, &origin), nullptr);
  EXPECT_EQ(origin, "later");
  EXPECT_EQ(c.effective_ranges(12288, 4096), test_table().shapes[0].ranges);
  // A table whose ranges break the limits is refused on the way in, too.
  DispatchTable broken = test_table();
  broken.shapes[0].ranges = {{1, G}, {20, C}};
  EXPECT_NE(test::error_of([&] { c.add_table(broken, "broken"); }).find("beyond its limit M = 8"), std::string::npos);
}

TEST(LinearDispatch, FallbackRule) {
  // GEMV at M = 1 (measured), flat GEMM for 2..16, cuBLAS above (dispatch_table.cpp says why).
  EXPECT_EQ(fallback_choice(1), G);
  for (int m = 2; m <= 16; ++m) EXPECT_EQ(fallback_choice(m), F) << m;
  for (int m : {17, 64, 65, 4096}) EXPECT_EQ(fallback_choice(m), C) << m;
  // Never beyond the kernels' limits, whatever they are.
  const LinearLimits small{0, 4};
  EXPECT_EQ(fallback_choice(1, small), F);
  EXPECT_EQ(fallback_choice(5, small), C);
  LinearChooser c;  // no tables
  for (int m = 1; m <= 70; ++m) EXPECT_EQ(c.choose(m, 123, 456), fallback_choice(m));
}

TEST(LinearDispatch, ForcedModes) {
  EXPECT_EQ(parse_linear_mode("auto"), LinearMode::Auto);
  EXPECT_EQ(parse_linear_mode("gemv"), LinearMode::Gemv);
  EXPECT_EQ(parse_linear_mode("flat"), LinearMode::Flat);
  EXPECT_EQ(parse_linear_mode("cublas"), LinearMode::Cublas);
  EXPECT_EQ(test::error_of([] { parse_linear_mode("fast"); }),
            "linear mode='fast' is not one of auto, gemv, flat, cublas");
  EXPECT_EQ(test::error_of([] { parse_linear_mode("fast", "FDPP_LINEAR"); }),
            "FDPP_LINEAR='fast' is not one of auto, gemv, flat, cublas");
  LinearChooser c;
  c.add_table(test_table(), "mem");  // ignored when forced
  c.set_mode(LinearMode::Gemv);
  for (int m = 1; m <= 100; ++m) EXPECT_EQ(c.choose(m, 12288, 4096), m <= 8 ? G : m <= 64 ? F : C) << m;
  c.set_mode(LinearMode::Flat);
  for (int m = 1; m <= 100; ++m) EXPECT_EQ(c.choose(m, 12288, 4096), m <= 64 ? F : C) << m;
  c.set_mode(LinearMode::Cublas);
  for (int m = 1; m <= 100; ++m) EXPECT_EQ(c.choose(m, 12288, 4096), C) << m;
  EXPECT_EQ(c.effective_ranges(12288, 4096), (std::vector<DispatchRange>{{1, C}}));
  c.set_mode(LinearMode::Gemv);
  EXPECT_EQ(c.effective_ranges(1, 1), (std::vector<DispatchRange>{{1, G}, {9, F}, {65, C}}));

  // An explicit GEMV threshold (DispatchSelectOptions::gemv_max_m): GEMV exactly up to it, the table above.
  LinearChooser t;
  t.add_table(test_table(), "mem");
  t.set_gemv_max_m(4);
  for (int m = 1; m <= 4; ++m) EXPECT_EQ(t.choose(m, 4096, 4096), G) << m;  // the table said flat
  EXPECT_EQ(t.choose(5, 4096, 4096), F);
  t.set_gemv_max_m(0);
  EXPECT_EQ(t.choose(1, 12288, 4096), F);  // the table said gemv: not allowed at all now
  EXPECT_NE(test::error_of([&] { t.set_gemv_max_m(9); }).find("not in [0, 8]"), std::string::npos);
}

// A measured curve per implementation (NaN beyond its limit).
ShapeTimes curves(const std::vector<int>& ms, const std::function<double(LinearImpl, int)>& f) {
  ShapeTimes t;
  t.m = ms;
  const LinearLimits l;
  for (LinearImpl impl : kAllLinearImpls)
    for (int m : ms) t.us[static_cast<int>(impl)].push_back(m <= l.max_m(impl) ? f(impl, m) : NAN);
  return t;
}

std::vector<int> default_ms() {
  std::vector<int> ms;
  for (int m = 1; m <= 64; ++m) ms.push_back(m);
  for (int m : {128, 256, 512, 1024, 4096}) ms.push_back(m);
  return ms;
}

// Every measured M: the choice is within tol of the fastest there; the ranges are valid.
void expect_within(const ShapeTimes& t, const std::vector<DispatchRange>& r, double tol) {
  LinearChooser c;
  DispatchTable table = test_table();
  table.shapes = {shape("s", 1, 1, r)};
  ASSERT_NO_THROW(c.add_table(table, "t"));  // validates the ranges
  for (size_t i = 0; i < t.m.size(); ++i) {
    double best = INFINITY;
    for (LinearImpl impl : kAllLinearImpls)
      if (std::isfinite(t.at(impl, i))) best = std::min(best, t.at(impl, i));
    const double chosen = t.at(c.choose(t.m[i], 1, 1), i);
    EXPECT_LE(chosen, best * (1 + tol) * (1 + 1e-12)) << "M " << t.m[i];
  }
}

TEST(LinearDispatch, RangesFromTimes) {
  const std::vector<int> ms = default_ms();
  // Monotone curves: GEMV grows with M, flat steps at each 8-row tile, cuBLAS flat until compute.
  const ShapeTimes t = curves(ms, [](LinearImpl impl, int m) {
    switch (impl) {
      case LinearImpl::Gemv: return 10.0 + 3.0 * m;
      case LinearImpl::Flat: return 14.0 + 0.5 * ((m + 7) / 8);
      default: return 16.75 + 0.001 * m;
    }
  });
  const auto r = ranges_from_times(t, 0.0);
  // GEMV < flat while 10 + 3M < 14.5 (M = 1); flat < cuBLAS while 14 + 0.5 ceil(M/8) < 16.75 + 0.001M
  // (M <= 40: 16.5 < 16.79; M = 41: 17 > 16.79).
  EXPECT_EQ(r, (std::vector<DispatchRange>{{1, G}, {2, F}, {41, C}})) << ShapeDispatch{"", 0, 0, r, {}}.ranges_string();
  expect_within(t, r, 0.0);

  // Curves that cross more than once: flat wins 2..24 and 33..64, cuBLAS 25..32 (by 10%).
  const ShapeTimes w = curves(ms, [](LinearImpl impl, int m) {
    switch (impl) {
      case LinearImpl::Gemv: return m == 1 ? 9.0 : 30.0;
      case LinearImpl::Flat: return (m >= 25 && m <= 32) ? 22.0 : 18.0;
      default: return 20.0;
    }
  });
  const auto r2 = ranges_from_times(w, 0.02);
  EXPECT_EQ(r2, (std::vector<DispatchRange>{{1, G}, {2, F}, {25, C}, {33, F}, {65, C}}));
  expect_within(w, r2, 0.02);

  // Within the tolerance, noise does not split ranges: flat and cuBLAS alternate by 1%.
  const ShapeTimes n = curves(ms, [](LinearImpl impl, int m) {
    if (impl == LinearImpl::Gemv) return 100.0;
    const bool odd = m % 2 == 1;
    return impl == LinearImpl::Flat ? (odd ? 20.0 : 20.2) : (odd ? 20.2 : 20.0);
  });
  const auto r3 = ranges_from_times(n, 0.02);
  EXPECT_EQ(r3.size(), 1u) << ShapeDispatch{"", 0, 0, r3, {}}.ranges_string();  // cuBLAS reaches furthest
  expect_within(n, r3, 0.02);
  const auto r4 = ranges_from_times(n, 0.0);  // no tolerance: every flip is a range
  EXPECT_GT(r4.size(), 60u);
  expect_within(n, r4, 0.0);

  // Sparse M: a choice continues up to the next measured M but never past its own limit.
  const std::vector<int> sparse{1, 2, 4, 8, 16, 64, 128};
  const ShapeTimes s = curves(sparse, [](LinearImpl impl, int m) {
    if (impl == LinearImpl::Gemv) return 1.0;   // wins wherever it runs (to M = 8)
    if (impl == LinearImpl::Flat) return 2.0;   // then flat (to 64)
    return m >= 128 ? 1.0 : 3.0;
  });
  EXPECT_EQ(ranges_from_times(s, 0.0), (std::vector<DispatchRange>{{1, G}, {9, F}, {65, C}}));
  // Measured only where GEMV runs: cuBLAS takes over above GEMV's limit.
  const ShapeTimes g = curves({1, 2, 4}, [](LinearImpl impl, int) { return impl == LinearImpl::Gemv ? 1.0 : 5.0; });
  EXPECT_EQ(ranges_from_times(g, 0.0), (std::vector<DispatchRange>{{1, G}, {9, C}}));
  // M measured from 4 on: the first choice also covers 1..3.
  const ShapeTimes late = curves({4, 8}, [](LinearImpl impl, int) { return impl == LinearImpl::Flat ? 1.0 : 5.0; });
  EXPECT_EQ(ranges_from_times(late, 0.0), (std::vector<DispatchRange>{{1, F}, {65, C}}));

  // Random curves: the guarantee holds at every measured M.
  for (int trial = 0; trial < 200; ++trial) {
    std::uniform_real_distribution<double> u(5.0, 50.0);
    const ShapeTimes x = curves(ms, [&](LinearImpl, int) { return u(test::rng()); });
    for (double tol : {0.0, 0.02, 0.1}) expect_within(x, ranges_from_times(x, tol), tol);
  }
  // An implementation that refused a shape (NaN everywhere) is never chosen.
  ShapeTimes refused = t;
  for (double& v : refused.us[1]) v = NAN;
  for (const DispatchRange& x : ranges_from_times(refused, 0.02)) EXPECT_NE(x.impl, F);
  // Nothing measured at some M: an error, not a guess.
  ShapeTimes none = t;
  const size_t at1024 = std::find(ms.begin(), ms.end(), 1024) - ms.begin();
  none.us[2][at1024] = NAN;  // M = 1024: only cuBLAS runs there
  EXPECT_NE(test::error_of([&] { ranges_from_times(none, 0.02); }).find("no implementation was measured at M = 1024"),
            std::string::npos);
}

TEST(LinearDispatch, MergeReplacesShapes) {
  DispatchFile f;
  f.tables.push_back(test_table());
  DispatchTable t = test_table();
  t.shapes = {shape("o", 4096, 4096, {{1, C}}), shape("down", 4096, 11008, {{1, G}, {2, C}})};
  t.created_by = "again";
  merge_dispatch_table(f, t);
  ASSERT_EQ(f.tables.size(), 1u);
  ASSERT_EQ(f.tables[0].shapes.size(), 3u);
  EXPECT_EQ(f.tables[0].find(4096, 4096)->ranges, (std::vector<DispatchRange>{{1, C}}));
  EXPECT_EQ(f.tables[0].find(12288, 4096)->ranges, test_table().shapes[0].ranges);
  EXPECT_EQ(f.tables[0].created_by, "again");
  merge_dispatch_table(f, test_table("Test GPU", "bf16"));
  EXPECT_EQ(f.tables.size(), 2u);
}

// cuBLASLt's timed choice is kept per row bucket (backend/cuda/linear_tuning.h): every M maps to a
// bucket at least as large, GEMV-sized M exactly, and a server's M = 1 .. 8192 needs few timings.
TEST(LinearDispatch, TuningRowBucketsAreFewAndCoverEveryM) {
  int buckets = 0, previous = 0;
  for (int m = 1; m <= 8192; ++m) {
    const int b = cuda::tuning_rows(m);
    EXPECT_GE(b, m);
    EXPECT_GE(b, previous) << m;  // monotone: a bucket is one range of M
    if (m <= 8) EXPECT_EQ(b, m);
    if (m > 8) EXPECT_LE(b, 2 * m) << m;
    if (b != previous) ++buckets;
    previous = b;
  }
  EXPECT_LE(buckets, 8 + 7 + 7 + 4);
  EXPECT_EQ(cuda::tuning_rows(1 << 20), 1 << 20);
}

TEST(LinearDispatch, ModelShapes) {
  const std::string dir = test::test_dir() + "/../configs/";
  if (!std::filesystem::exists(dir + "llama-2-7b.json")) GTEST_SKIP() << "configs/ not present";
  auto shapes_of = [&](const char* name) {
    const std::string p = dir + name + ".json";
    return model_linear_shapes(parse_hf_config(read_json_file(p), nullptr, p, p).config);
  };
  auto expect = [](const std::vector<LinearShape>& s, const std::vector<std::tuple<std::string, int, int>>& want) {
    ASSERT_EQ(s.size(), want.size());
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(s[i].name, std::get<0>(want[i]));
      EXPECT_EQ(s[i].n, std::get<1>(want[i])) << s[i].name;
      EXPECT_EQ(s[i].k, std::get<2>(want[i])) << s[i].name;
    }
  };
  // DESIGN.md's Llama-2-7B shapes: QKV [12288, 4096], O [4096, 4096], gate+up [22016, 4096], down [4096, 11008].
  expect(shapes_of("llama-2-7b"), {{"qkv", 12288, 4096}, {"o", 4096, 4096}, {"gate_up", 22016, 4096},
                                   {"down", 4096, 11008}, {"lm_head", 32000, 4096}});
  expect(shapes_of("llama-3-8b"), {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096},
                                   {"down", 4096, 14336}, {"lm_head", 128256, 4096}});
  expect(shapes_of("opt-6.7b"), {{"qkv", 12288, 4096}, {"o", 4096, 4096}, {"fc1", 16384, 4096},
                                 {"fc2", 4096, 16384}, {"lm_head", 50272, 4096}});
  expect(shapes_of("chatglm2-6b"), {{"qkv", 4608, 4096}, {"o", 4096, 4096}, {"gate_up", 27392, 4096},
                                    {"down", 4096, 13696}, {"lm_head", 65024, 4096}});
  // Repeated shapes merge (a model whose o and down coincide).
  const std::vector<LinearShape> s{{"o", 4096, 4096}, {"down", 4096, 4096}, {"qkv", 12288, 4096}};
  const auto u = unique_linear_shapes(s);
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].name, "o+down");
  // Presets by name (configs/ found from the executable or the source tree).
  EXPECT_EQ(std::filesystem::path(preset_config_path("llama-2-7b")).filename(), "llama-2-7b.json");
  const std::string msg = test::error_of([] { preset_config_path("llama-9"); });
  EXPECT_NE(msg.find("presets: chatglm2-6b, gemma-2-9b, gemma-3-12b, llama-2-13b"), std::string::npos) << msg;
}

TEST(LinearDispatch, LookupOrderAndMismatches) {
  const auto dir = test::scratch_dir("dispatch_lookup");
  ScopedEnv cache("FDPP_CACHE", (dir / "cache").string().c_str());
  ScopedEnv linear("FDPP_LINEAR", nullptr);
  ScopedEnv gemv_max("FDPP_GEMV_MAX_M", nullptr);
  ScopedEnv table_env("FDPP_DISPATCH_TABLE", nullptr);
  const std::string model = (dir / "model.gguf").string();
  test::write_text(model, "model");
  EXPECT_EQ(dispatch_path_beside(model), model + ".fdpp-dispatch.json");
  EXPECT_EQ(dispatch_path_beside(dir.string()), (dir / "fdpp-dispatch.json").string());
  EXPECT_EQ(dispatch_path_in_cache("Test GPU", 132),
            (dir / "cache" / "dispatch" / "test-gpu-132sm.fdpp-dispatch.json").string());

  DispatchSelectOptions o;
  o.model_path = model;
  o.search_shipped = false;
  auto load = [&](const DispatchSelectOptions& opt, const char* gpu = "Test GPU", const char* dtype = "f16") {
    return LinearChooser::load(opt, gpu, 132, dtype);
  };
  // Nothing anywhere: the fallback rule.
  EXPECT_EQ(load(o).find(4096, 4096), nullptr);
  EXPECT_NE(load(o).describe({}).find("no table: the fallback rule"), std::string::npos);

  // The cache (a table per GPU, for every model).
  auto table_with_o = [](std::vector<DispatchRange> r, const std::string& gpu = "Test GPU") {
    DispatchTable t = test_table(gpu);
    t.shapes = {shape("o", 4096, 4096, std::move(r))};
    return t;
  };
  DispatchFile cached;
  cached.tables = {table_with_o({{1, C}})};
  cached.tables[0].shapes.push_back(shape("down", 4096, 11008, {{1, G}, {2, C}}));
  write_dispatch_file(cached, dispatch_path_in_cache("Test GPU", 132));
  EXPECT_EQ(load(o).choose(1, 4096, 4096), C);

  // Beside the model wins over the cache, shape by shape.
  DispatchFile beside;
  beside.tables = {table_with_o({{1, F}, {9, C}})};
  write_dispatch_file(beside, dispatch_path_beside(model));
  LinearChooser c = load(o);
  EXPECT_EQ(c.choose(1, 4096, 4096), F);
  EXPECT_EQ(c.choose(1, 4096, 11008), G);  // only the cache has down
  const std::string d = c.describe(std::vector<LinearShape>{{"o", 4096, 4096}, {"down", 4096, 11008}, {"x", 5, 5}});
  EXPECT_NE(d.find("Test GPU (132 SMs) f16, mode auto"), std::string::npos) << d;
  EXPECT_NE(d.find("o        [4096, 4096]  M1 1   M2 9    1-8 flat | 9+ cublas"), std::string::npos) << d;
  EXPECT_NE(d.find("(beside the model)"), std::string::npos) << d;
  EXPECT_NE(d.find("down     [4096, 11008]  M1 2   M2 2    1 gemv | 2+ cublas"), std::string::npos) << d;
  EXPECT_NE(d.find("fallback rule: no table for this shape"), std::string::npos) << d;
  const auto dj = c.describe_json(std::vector<LinearShape>{{"o", 4096, 4096}});
  EXPECT_EQ(dj["shapes"][0]["m2"], 9);
  EXPECT_EQ(dj["shapes"][0]["ranges"], "1-8 flat | 9+ cublas");

  // An explicit table wins over both.
  DispatchFile expl;
  expl.tables = {table_with_o({{1, G}, {2, C}})};
  const std::string explicit_path = (dir / "explicit.json").string();
  write_dispatch_file(expl, explicit_path);
  o.table_path = explicit_path;
  EXPECT_EQ(load(o).choose(1, 4096, 4096), G);
  // ... and $FDPP_DISPATCH_TABLE is the front ends' fallback (environment_fallback.h), never read
  // by the chooser itself.
  o.table_path.clear();
  {
    ScopedEnv env("FDPP_DISPATCH_TABLE", explicit_path.c_str());
    EXPECT_EQ(load(o).choose(1, 4096, 4096), F);  // the table beside the model
    DispatchSelectOptions from_env = o;
    apply_linear_environment(from_env);
    EXPECT_EQ(from_env.table_path, explicit_path);
    EXPECT_EQ(load(from_env).choose(1, 4096, 4096), G);
  }

  // Mismatches: an explicit table for another GPU or dtype is an error naming both; automatic
  // ones are skipped with a note.
  o.table_path = explicit_path;
  std::string msg = test::error_of([&] { load(o, "Other GPU"); });
  EXPECT_NE(msg.find("explicit.json: no dispatch table for Other GPU (132 SMs) f16 (the file has: Test GPU (132 SMs) "
                     "f16)"),
            std::string::npos)
      << msg;
  msg = test::error_of([&] { load(o, "Test GPU", "bf16"); });
  EXPECT_NE(msg.find("no dispatch table for Test GPU (132 SMs) bf16"), std::string::npos) << msg;
  o.table_path.clear();
  c = load(o, "Test GPU", "bf16");
  EXPECT_EQ(c.find(4096, 4096), nullptr);
  EXPECT_NE(c.describe({}).find("(beside the model) skipped: no table for this GPU and dtype (it has: Test GPU (132 "
                                "SMs) f16)"),
            std::string::npos)
      << c.describe({});
  // A malformed file in the lookup is an error, not skipped.
  test::write_text(dispatch_path_beside(model), "{\"format\": \"fdpp-linear-dispatch\", \"version\": 1}");
  msg = test::error_of([&] { load(o); });
  EXPECT_NE(msg.find(model + ".fdpp-dispatch.json: 'tables' is missing"), std::string::npos) << msg;
  o.table_path = (dir / "missing.json").string();
  EXPECT_NE(test::error_of([&] { load(o); }).find("missing.json: cannot open"), std::string::npos);
  o.table_path.clear();
  std::filesystem::remove(dispatch_path_beside(model));

  // Modes and the GEMV threshold from the options; the chooser ignores the environment.
  o.mode = "cublas";
  c = load(o);
  EXPECT_EQ(c.choose(1, 4096, 11008), C);
  EXPECT_NE(c.describe({}).find("mode cublas (linear mode cublas"), std::string::npos) << c.describe({});
  o.mode = "gpu";
  EXPECT_EQ(test::error_of([&] { load(o); }), "linear mode='gpu' is not one of auto, gemv, flat, cublas");
  o.mode.clear();
  {
    ScopedEnv env("FDPP_LINEAR", "flat");
    ScopedEnv gemv("FDPP_GEMV_MAX_M", "4");
    EXPECT_EQ(load(o).choose(1, 4096, 11008), G);
    EXPECT_EQ(load(o).choose(4, 4096, 4096), C);
  }
  o.gemv_max_m = 4;
  EXPECT_EQ(load(o).choose(4, 4096, 4096), G);
  o.gemv_max_m = 12;
  EXPECT_EQ(test::error_of([&] { load(o); }), "GEMV max M 12 is not in [0, 8]");
  o.gemv_max_m = -1;
  std::filesystem::remove_all(dir);
}

TEST(LinearDispatch, ShippedTablesAreValid) {
  // Every table under configs/dispatch/ parses (a broken one would stop every CUDA run).
  const std::string configs = repo_configs_dir();
  if (configs.empty()) GTEST_SKIP() << "configs/ not found";
  const std::filesystem::path dir = std::filesystem::path(configs) / "dispatch";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no configs/dispatch";
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") EXPECT_NO_THROW(read_dispatch_file(e.path().string())) << e.path();
}

}  // namespace
}  // namespace fdpp
