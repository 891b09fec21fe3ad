// The CPU reference of asynchronized softmax with unified max (attention/unified_max.h) against
// cpu::attention, adversarial rows, the bounds derivation, and calibration files
// (attention/calibration.h).
#include <cfloat>
#include <cmath>

#include <chrono>

#include "attention/calibration.h"
#include "runtime/calibrate.h"
#include "attention/unified_max.h"
#include "backend/cpu/unified_max_reference.h"
#include "backend/cpu/cpu_runner.h"
#include "backend/cpu/ops.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

namespace fdpp {
namespace {

using test::nmse;
using test::random_vector;
using test::rng;

// The stable reference for one row: cpu::attention with one query at position len - 1, one head.
std::vector<float> stable_reference(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int len, int head_dim, float scale) {
  std::vector<float> out(head_dim);
  cpu::attention(q.data(), k.data(), v.data(), 1, len - 1, 1, 1, head_dim, scale, out.data());
  return out;
}

float row_max_logit(const std::vector<float>& q, const std::vector<float>& k, int len, int head_dim, float scale) {
  float m = -INFINITY;
  for (int j = 0; j < len; ++j) {
    float s = 0.f;
    for (int d = 0; d < head_dim; ++d) s += q[d] * k[static_cast<size_t>(j) * head_dim + d];
    m = std::max(m, s * scale);
  }
  return m;
}

bool all_finite(const std::vector<float>& x) {
  for (float f : x)
    if (!std::isfinite(f)) return false;
  return true;
}

TEST(UnifiedMax, BoundsDerivation) {
  for (int64_t n : {int64_t{1}, int64_t{2048}, int64_t{8192}, int64_t{32768}, int64_t{131072}, int64_t{1} << 20}) {
    const UnifiedMaxBounds b = derive_unified_max_bounds(0.f, n);
    const double ln_n = std::log(static_cast<double>(n));
    EXPECT_LT(b.b + ln_n, std::log(FLT_MAX)) << n;
    // With the value headroom: N e^b 2^16 stays finite.
    EXPECT_TRUE(std::isfinite(static_cast<float>(n) * std::exp(b.b) * 65536.f)) << n;
    // e^a is a normal float, and so is every term within 24 ln 2 + ln N of it.
    EXPECT_TRUE(std::isnormal(std::exp(b.a))) << n;
    EXPECT_GE(std::exp(static_cast<double>(b.a)) * std::pow(2.0, -24) / static_cast<double>(n), FLT_MIN) << n;
    EXPECT_LT(b.a, 0.f);
    EXPECT_GT(b.b, 0.f);
  }
  const UnifiedMaxBounds b17 = derive_unified_max_bounds(1.5f, 131072);
  EXPECT_EQ(b17.phi, 1.5f);
  EXPECT_NEAR(b17.a, -57.917, 1e-3);
  EXPECT_NEAR(b17.b, 64.849, 1e-3);
  EXPECT_GE(b17.a, -60.f);
  EXPECT_TRUE(b17.contains(1.5f + 64.8f));
  EXPECT_FALSE(b17.contains(1.5f + 64.9f));
  EXPECT_TRUE(b17.contains(1.5f - 57.9f));
  EXPECT_FALSE(b17.contains(1.5f - 58.0f));
  const UnifiedMaxBounds d = default_unified_max_bounds(8192);
  EXPECT_EQ(d.phi, 0.f);
  test::error_of([] { derive_unified_max_bounds(0.f, 0); });
  test::error_of([] { derive_unified_max_bounds(NAN, 8192); });
}

// Rows inside the bounds: equal to the stable softmax to fp32 rounding, for every tile size.
TEST(UnifiedMax, MatchesStableInsideBounds) {
  const int head_dim = 64;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const UnifiedMaxBounds base = derive_unified_max_bounds(0.f, 131072);
  std::uniform_real_distribution<float> offset_dist(base.a + 0.5f, base.b - 0.5f);
  std::uniform_real_distribution<float> qscale_dist(0.1f, 3.0f);
  for (int len : {1, 2, 3, 7, 64, 65, 127, 500, 1024, 2049, 4096}) {
    for (int rep = 0; rep < 4; ++rep) {
      const std::vector<float> q = random_vector(head_dim, qscale_dist(rng()));
      const std::vector<float> k = random_vector(static_cast<size_t>(len) * head_dim);
      const std::vector<float> v = random_vector(static_cast<size_t>(len) * head_dim);
      const std::vector<float> ref = stable_reference(q, k, v, len, head_dim, scale);
      // phi placed so that the row's max - phi is anywhere inside [a, b], ends included (almost).
      UnifiedMaxBounds bounds = base;
      const float m = row_max_logit(q, k, len, head_dim, scale);
      bounds.phi = m - offset_dist(rng());
      ASSERT_TRUE(bounds.contains(m));
      for (int tile = 1; tile <= 64; ++tile) {
        std::vector<float> out(head_dim);
        const bool fell_back = unified_max_attention_row(q.data(), k.data(), v.data(), len, head_dim, head_dim, scale,
                                                         bounds, tile, out.data());
        EXPECT_FALSE(fell_back) << "len " << len << " tile " << tile;
        EXPECT_LE(nmse(out, ref), 1e-10) << "len " << len << " tile " << tile << " max - phi " << m - bounds.phi;
      }
    }
  }
}

// The worst rows the bounds admit, in fp32: max_context keys all at max - phi = b with |v| = 2^16
// (the largest sums), and all at max - phi = a with the smallest relevant terms 24 ln 2 + ln N
// below (the smallest). Both stay finite and exact, without a fallback.
TEST(UnifiedMax, WorstCaseRowsAtTheEnds) {
  const int n = 131072;
  const UnifiedMaxBounds bounds = derive_unified_max_bounds(3.0f, n);
  const float q = 1.f;
  std::vector<float> k(n), v(n), out(1);
  // Top end: every logit at phi + b, every value 2^16.
  std::fill(k.begin(), k.end(), bounds.phi + bounds.b);
  std::fill(v.begin(), v.end(), 65536.f);
  ASSERT_TRUE(bounds.contains(k[0]));
  for (int tile : {1, 256, n}) {
    EXPECT_FALSE(unified_max_attention_row(&q, k.data(), v.data(), n, 1, 1, 1.f, bounds, tile, out.data()));
    EXPECT_TRUE(std::isfinite(out[0]));
    EXPECT_FLOAT_EQ(out[0], 65536.f) << "tile " << tile;
  }
  // Bottom end: the max at phi + a (value 1). A term 24 ln 2 + ln N below it (weight 2^-24 / N of
  // the max, the smallest that can matter) is still a normal float. The rest of the row sits 10
  // nats below the max (value -1; together they outweigh it about 6 to 1), so the answer depends on
  // every one of them.
  const float low = bounds.phi + bounds.a;
  const float lowest = low - static_cast<float>(24.0 * std::log(2.0) + std::log(static_cast<double>(n)));
  ASSERT_TRUE(std::isnormal(std::exp(lowest - bounds.phi)));
  const float lower = low - 10.f;
  std::fill(k.begin(), k.end(), lower);
  std::fill(v.begin(), v.end(), -1.f);
  k[n / 3] = low;
  v[n / 3] = 1.f;
  // The exact answer in double: (1 - (N - 1) r) / (1 + (N - 1) r), r = e^(lower - low) in fp32 terms.
  const double r = static_cast<double>(std::exp(lower - bounds.phi)) / std::exp(low - bounds.phi);
  const double exact = (1.0 - (n - 1) * r) / (1.0 + (n - 1) * r);
  for (int tile : {1, 256, n}) {
    EXPECT_FALSE(unified_max_attention_row(&q, k.data(), v.data(), n, 1, 1, 1.f, bounds, tile, out.data()));
    EXPECT_NEAR(out[0], exact, 1e-6 * std::abs(exact)) << "tile " << tile;
    EXPECT_LT(out[0], -0.5f) << "the small terms were lost";
  }
}

// GQA-style strides: k/v rows kv_stride floats apart, the row reading one head of several.
TEST(UnifiedMax, KvStride) {
  const int head_dim = 32, n_kv = 3, len = 300;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::vector<float> q = random_vector(head_dim);
  const std::vector<float> k = random_vector(static_cast<size_t>(len) * n_kv * head_dim);
  const std::vector<float> v = random_vector(static_cast<size_t>(len) * n_kv * head_dim);
  for (int h = 0; h < n_kv; ++h) {
    // cpu::attention with n_heads = n_kv_heads = 3, one query: head h's output.
    std::vector<float> q3(static_cast<size_t>(n_kv) * head_dim, 0.f), ref3(q3.size());
    std::copy(q.begin(), q.end(), q3.begin() + h * head_dim);
    cpu::attention(q3.data(), k.data(), v.data(), 1, len - 1, n_kv, n_kv, head_dim, scale, ref3.data());
    const std::vector<float> ref(ref3.begin() + h * head_dim, ref3.begin() + (h + 1) * head_dim);
    std::vector<float> out(head_dim);
    const bool fb = unified_max_attention_row(q.data(), k.data() + h * head_dim, v.data() + h * head_dim, len,
                                              head_dim, n_kv * head_dim, scale, default_unified_max_bounds(4096), 37,
                                              out.data());
    EXPECT_FALSE(fb);
    EXPECT_LE(nmse(out, ref), 1e-10) << "head " << h;
  }
}

// Adversarial rows: the stable result, no inf/NaN, and a fallback exactly when max - phi is
// outside [a, b].
TEST(UnifiedMax, AdversarialRows) {
  const int head_dim = 64;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const UnifiedMaxBounds bounds = derive_unified_max_bounds(0.f, 131072);
  int expected_fallbacks = 0, fallbacks = 0, rows = 0;
  auto check_row = [&](const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int len,
                       const std::string& what) {
    const std::vector<float> ref = stable_reference(q, k, v, len, head_dim, scale);
    ASSERT_TRUE(all_finite(ref)) << what;
    const float m = row_max_logit(q, k, len, head_dim, scale);
    const bool expect_fb = !bounds.contains(m);
    for (int tile : {1, 5, 64, 4096}) {
      std::vector<float> out(head_dim);
      const bool fb = unified_max_attention_row(q.data(), k.data(), v.data(), len, head_dim, head_dim, scale, bounds,
                                                tile, out.data());
      ++rows;
      expected_fallbacks += expect_fb;
      fallbacks += fb;
      EXPECT_EQ(fb, expect_fb) << what << " tile " << tile << " max - phi " << m - bounds.phi;
      EXPECT_TRUE(all_finite(out)) << what << " tile " << tile;
      EXPECT_LE(nmse(out, ref), 1e-10) << what << " tile " << tile << " max - phi " << m - bounds.phi;
    }
  };
  std::uniform_int_distribution<int> len_dist(1, 3000);
  for (int rep = 0; rep < 3; ++rep) {
    const int len = len_dist(rng());
    std::uniform_int_distribution<int> pos_dist(0, len - 1);
    const std::vector<float> k = random_vector(static_cast<size_t>(len) * head_dim);
    const std::vector<float> v = random_vector(static_cast<size_t>(len) * head_dim);
    const std::vector<float> q0 = random_vector(head_dim);
    // q scaled so that the logits reach about +-1e4 (both signs of the scale).
    for (float target : {1e4f, -1e4f, 100.f, 60.f}) {
      const float m = std::abs(row_max_logit(q0, k, len, head_dim, scale));
      std::vector<float> q = q0;
      for (float& x : q) x *= target / std::max(m, 1e-3f);
      check_row(q, k, v, len, fmt::format("q scaled to {} (len {})", target, len));
    }
    // A single huge logit: key j aligned with q, far beyond the others.
    {
      std::vector<float> kk = k;
      const int j = pos_dist(rng());
      for (int d = 0; d < head_dim; ++d) kk[static_cast<size_t>(j) * head_dim + d] = q0[d] * 200.f;
      check_row(q0, kk, v, len, fmt::format("single huge logit at {} (len {})", j, len));
    }
    // All logits equal (q = 0: every logit is 0, max - phi = 0 inside; and with all keys equal at
    // a logit far below phi + a, outside).
    {
      std::vector<float> q(head_dim, 0.f);
      check_row(q, k, v, len, fmt::format("all logits zero (len {})", len));
      std::vector<float> kk(static_cast<size_t>(len) * head_dim);
      for (int j = 0; j < len; ++j)
        for (int d = 0; d < head_dim; ++d) kk[static_cast<size_t>(j) * head_dim + d] = -q0[d];
      // logit = -c |q0|^2 scale = -100 with c = 100 / (|q0|^2 scale).
      float qq0 = 0.f;
      for (float x : q0) qq0 += x * x;
      std::vector<float> qq = q0;
      for (float& x : qq) x *= 100.f / (std::max(qq0, 1e-6f) * scale);
      check_row(qq, kk, v, len, fmt::format("all logits equal and very negative (len {})", len));
    }
    // Mixing both: a row of moderate logits with one far above and one far below.
    {
      std::vector<float> kk = k;
      const int hi = pos_dist(rng()), lo = pos_dist(rng());
      for (int d = 0; d < head_dim; ++d) {
        kk[static_cast<size_t>(lo) * head_dim + d] = -q0[d] * 500.f;
        kk[static_cast<size_t>(hi) * head_dim + d] = q0[d] * 500.f;
      }
      check_row(q0, kk, v, len, fmt::format("huge and tiny logits mixed (len {})", len));
    }
  }
  EXPECT_EQ(fallbacks, expected_fallbacks);
  EXPECT_GT(expected_fallbacks, 0);
  EXPECT_LT(expected_fallbacks, rows);
}

TEST(UnifiedMax, RejectsBadArguments) {
  std::vector<float> q(4, 0.f), k(4, 0.f), v(4, 0.f), out(4);
  const UnifiedMaxBounds b = default_unified_max_bounds(16);
  test::error_of([&] { unified_max_attention_row(q.data(), k.data(), v.data(), 0, 4, 4, 1.f, b, 1, out.data()); });
  test::error_of([&] { unified_max_attention_row(q.data(), k.data(), v.data(), 1, 4, 4, 1.f, b, 0, out.data()); });
}

// --- Calibration ---------------------------------------------------------------------------

// A calibration of the model at model_path, made up: the file tests need no model.
Calibration fake_calibration(const std::string& model_path, int layers) {
  Calibration c;
  c.model_path = model_path;
  c.model_name = "fake";
  c.model_fingerprint = model_fingerprint(model_path, &c.model_size);
  c.max_context = 4096;
  c.percentile = 99.0;
  c.prompts = 1;
  c.tokens = 10;
  for (int i = 0; i < layers; ++i) {
    LayerCalibration l;
    l.bounds = derive_unified_max_bounds(0.5f * static_cast<float>(i), c.max_context);
    l.rows = 100;
    l.fallback_rate = 0.01 * i;
    l.row_max = {{"min", -1.f}, {"p50", 2.f}, {"max", 5.f}};
    l.logits = {{"min", -9.f}, {"max", 5.f}};
    l.heads.push_back(HeadCalibration{0.25f, {{"max", 5.f}}, {{"min", -9.f}, {"max", 5.f}}, -9.f, 5.f});
    c.layers.push_back(l);
  }
  return c;
}

void expect_same(const Calibration& a, const Calibration& b) {
  EXPECT_EQ(a.model_path, b.model_path);
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.model_size, b.model_size);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    EXPECT_EQ(a.layers[i].bounds.phi, b.layers[i].bounds.phi) << i;
    EXPECT_EQ(a.layers[i].bounds.a, b.layers[i].bounds.a) << i;
    EXPECT_EQ(a.layers[i].bounds.b, b.layers[i].bounds.b) << i;
    EXPECT_EQ(a.layers[i].rows, b.layers[i].rows) << i;
    EXPECT_DOUBLE_EQ(a.layers[i].fallback_rate, b.layers[i].fallback_rate) << i;
    EXPECT_EQ(a.layers[i].row_max, b.layers[i].row_max) << i;
    ASSERT_EQ(a.layers[i].heads.size(), b.layers[i].heads.size()) << i;
    for (size_t h = 0; h < a.layers[i].heads.size(); ++h) {
      EXPECT_EQ(a.layers[i].heads[h].phi, b.layers[i].heads[h].phi);
      EXPECT_EQ(a.layers[i].heads[h].row_max, b.layers[i].heads[h].row_max);
      EXPECT_EQ(a.layers[i].heads[h].logits, b.layers[i].heads[h].logits);
    }
  }
}

TEST(Calibration, FindsBesideOrInCacheAndChecksTheModel) {
  const auto dir = test::scratch_dir("calib_find");
  const std::string model = (dir / "model.gguf").string();
  test::write_text(model, "not really a model, but a file with a fingerprint");
  const char* old_cache = std::getenv("FDPP_CACHE");
  const std::optional<std::string> saved_cache = old_cache ? std::optional<std::string>(old_cache) : std::nullopt;
  ::setenv("FDPP_CACHE", (dir / "cache").string().c_str(), 1);
  EXPECT_FALSE(load_calibration(model).has_value());
  EXPECT_EQ(calibration_path_beside(model), model + ".fdpp-calib.json");
  EXPECT_EQ(default_calibration_output(model), model + ".fdpp-calib.json");  // the dir is writable

  // In the cache.
  Calibration c = fake_calibration(model, 3);
  const std::string cached = calibration_path_in_cache(model);
  EXPECT_EQ(cached.rfind((dir / "cache" / "calib").string(), 0), 0u) << cached;
  write_calibration(c, cached);
  std::optional<Calibration> found = load_calibration(model);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, cached);
  expect_same(c, *found);

  // Beside the model wins.
  write_calibration(c, calibration_path_beside(model));
  found = load_calibration(model);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, model + ".fdpp-calib.json");
  EXPECT_NEAR(found->phi_min(), 0.f, 0.f);
  EXPECT_NEAR(found->phi_max(), 1.f, 0.f);

  // Another model file under the same name: refused, naming the calibration file.
  test::write_text(model, "a different model file");
  const std::string msg = test::error_of([&] { load_calibration(model); });
  EXPECT_NE(msg.find(model + ".fdpp-calib.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("another model"), std::string::npos) << msg;
  if (saved_cache) ::setenv("FDPP_CACHE", saved_cache->c_str(), 1);
  else ::unsetenv("FDPP_CACHE");
  std::filesystem::remove_all(dir);
}

TEST(Calibration, RejectsMalformedFiles) {
  const auto dir = test::scratch_dir("calib_bad");
  const std::string model = (dir / "model.gguf").string();
  test::write_text(model, "model bytes");
  Calibration good = fake_calibration(model, 2);
  const std::string good_path = (dir / "good.json").string();
  write_calibration(good, good_path);
  std::ifstream f(good_path);
  const nlohmann::json valid = nlohmann::json::parse(f);
  expect_same(good, read_calibration(good_path));

  std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"not_json", "hello\nworld"},
      {"truncated", valid.dump().substr(0, 100)},
      {"array", "[1, 2, 3]"},
  };
  auto edited = [&](const std::string& name, auto&& edit) {
    nlohmann::json j = valid;
    edit(j);
    cases.emplace_back(name, j.dump());
  };
  edited("wrong_format", [](nlohmann::json& j) { j["format"] = "something-else"; });
  edited("wrong_version", [](nlohmann::json& j) { j["version"] = 99; });
  edited("no_layers", [](nlohmann::json& j) { j["layers"] = nlohmann::json::array(); });
  edited("layers_not_array", [](nlohmann::json& j) { j["layers"] = 7; });
  edited("no_model", [](nlohmann::json& j) { j.erase("model"); });
  edited("phi_missing", [](nlohmann::json& j) { j["layers"][1].erase("phi"); });
  edited("phi_string", [](nlohmann::json& j) { j["layers"][0]["phi"] = "1.0"; });
  edited("phi_null", [](nlohmann::json& j) { j["layers"][0]["phi"] = nullptr; });
  edited("phi_huge", [](nlohmann::json& j) { j["layers"][0]["phi"] = 1e300; });
  edited("a_positive", [](nlohmann::json& j) { j["layers"][0]["a"] = 1.0; });
  edited("b_too_wide", [](nlohmann::json& j) { j["layers"][0]["b"] = 88.0; });
  edited("a_too_wide", [](nlohmann::json& j) { j["layers"][0]["a"] = -100.0; });
  edited("fallback_rate_2", [](nlohmann::json& j) { j["layers"][0]["fallback_rate"] = 2.0; });
  edited("max_context_0", [](nlohmann::json& j) { j["max_context"] = 0; });
  edited("max_context_string", [](nlohmann::json& j) { j["max_context"] = "lots"; });
  for (const auto& [name, text] : cases) {
    const std::string path = (dir / (name + ".json")).string();
    test::write_text(path, text);
    const std::string msg = test::error_of([&] { read_calibration(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << name << ": " << msg;
  }
  const std::string missing = (dir / "missing.json").string();
  EXPECT_NE(test::error_of([&] { read_calibration(missing); }).find(missing), std::string::npos);
  // A malformed file beside the model makes load_calibration fail, naming it.
  test::write_text(calibration_path_beside(model), "{");
  EXPECT_NE(test::error_of([&] { load_calibration(model); }).find(calibration_path_beside(model)),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Calibration, PromptsFile) {
  const auto dir = test::scratch_dir("calib_prompts");
  const std::string p = (dir / "prompts.txt").string();
  test::write_text(p, "\n\nFirst paragraph,\nstill first.\n\n  \nSecond one.\r\n\r\n\n\nThird.\n");
  const std::vector<std::string> prompts = read_calibration_prompts(p);
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[0], "First paragraph,\nstill first.");
  EXPECT_EQ(prompts[1], "Second one.");
  EXPECT_EQ(prompts[2], "Third.");
  test::write_text(p, "\n \n\t\n");
  EXPECT_NE(test::error_of([&] { read_calibration_prompts(p); }).find(p), std::string::npos);
  const std::string missing = (dir / "nope.txt").string();
  EXPECT_NE(test::error_of([&] { read_calibration_prompts(missing); }).find(missing), std::string::npos);
  EXPECT_EQ(builtin_calibration_prompts().size(), 10u);
  std::filesystem::remove_all(dir);
}

// The default model with a short prompt set: per-layer phi finite, fallback <= 0.5%, and the
// file round-trips. The built-in set holds >= 2000 tokens.
TEST(Calibration, DefaultModel) {
  const std::string path = test::default_model_or_empty();
  if (path.empty()) GTEST_SKIP() << "default model not fetched (scripts/fetch-default-model.sh)";
  const auto t0 = std::chrono::steady_clock::now();
  const LoadedModel m = load_model(path);
  ASSERT_NE(m.tokenizer, nullptr);
  size_t builtin_tokens = 0;
  for (const auto& p : builtin_calibration_prompts()) builtin_tokens += m.tokenizer->encode(p, false, false).size();
  EXPECT_GE(builtin_tokens, 2000u);

  const std::vector<std::string> prompts = {builtin_calibration_prompts()[0], builtin_calibration_prompts()[4],
                                            builtin_calibration_prompts()[3]};
  CalibrationOptions opt;
  opt.max_tokens_per_prompt = 48;
  Calibration c = calibrate_on_cpu(m, path, prompts, opt);
  ASSERT_EQ(static_cast<int>(c.layers.size()), m.config().n_layers);
  EXPECT_EQ(c.prompts, 3);
  EXPECT_EQ(c.tokens, 3 * 48);
  const UnifiedMaxBounds range = derive_unified_max_bounds(0.f, m.config().max_context);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerCalibration& l = c.layers[i];
    EXPECT_TRUE(std::isfinite(l.bounds.phi)) << i;
    EXPECT_EQ(l.bounds.a, range.a);
    EXPECT_EQ(l.bounds.b, range.b);
    EXPECT_EQ(l.rows, c.tokens * m.config().n_heads) << i;
    EXPECT_LE(l.fallback_rate, 0.005) << i;
    EXPECT_EQ(static_cast<int>(l.heads.size()), m.config().n_heads);
    for (const HeadCalibration& h : l.heads) {
      EXPECT_TRUE(std::isfinite(h.phi));
      EXPECT_EQ(h.logits.at("max"), h.row_max.at("max"));
      EXPECT_LE(h.logits.at("min"), h.logits.at("p50"));
    }
    EXPECT_LE(l.row_max.at("min"), l.row_max.at("p50"));
    EXPECT_LE(l.row_max.at("p50"), l.row_max.at("max"));
    EXPECT_LE(l.logits.at("min"), l.row_max.at("min"));
    EXPECT_EQ(l.logits.at("max"), l.row_max.at("max"));
    // The observed row maxima sit inside [phi + a, phi + b] with the rule's margin.
    EXPECT_TRUE(l.bounds.contains(l.row_max.at("min")) && l.bounds.contains(l.row_max.at("max"))) << i;
  }
  EXPECT_LE(c.fallback_rate(), 0.005);

  // The unified-max reference on the model's own attention rows, with the calibrated phi of each
  // layer: the stable result, and a fallback exactly where the calibration counted one.
  {
    CpuRunner runner(m.config(), m.weights, 48);
    std::vector<float> got, want;
    int64_t rows = 0, fallbacks = 0, expected = 0;
    runner.set_attention_observer([&](const AttentionObservation& o) {
      const UnifiedMaxBounds& bounds = c.layers[static_cast<size_t>(o.layer)].bounds;
      const int group = o.n_heads / o.n_kv_heads;
      const int kv_stride = o.n_kv_heads * o.head_dim;
      std::vector<float> out(o.head_dim), ref(o.head_dim);
      for (int64_t t = 0; t < o.n_q; t += 3) {
        for (int h = 0; h < o.n_heads; ++h) {
          const float* q = o.q + (t * o.n_heads + h) * o.head_dim;
          const float* k = o.k + (h / group) * o.head_dim;
          const float* v = o.v + (h / group) * o.head_dim;
          const int len = static_cast<int>(o.start_pos + t + 1);
          float m = -INFINITY;
          for (int j = 0; j < len; ++j)
            m = std::max(m, cpu::attention_dot(q, k + static_cast<int64_t>(j) * kv_stride, o.head_dim) * o.scale);
          expected += !bounds.contains(m);
          fallbacks += unified_max_attention_row(q, k, v, len, o.head_dim, kv_stride, o.scale, bounds, 16, out.data());
          stable_attention_row(q, k, v, len, o.head_dim, kv_stride, o.scale, ref.data());
          got.insert(got.end(), out.begin(), out.end());
          want.insert(want.end(), ref.begin(), ref.end());
          ++rows;
        }
      }
    });
    std::vector<int32_t> ids = m.tokenizer->encode(prompts[1], true, false);
    ids.resize(std::min<size_t>(ids.size(), 48));
    std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
    runner.forward(ids, 0, false, logits);
    EXPECT_GT(rows, 0);
    EXPECT_EQ(fallbacks, expected);
    EXPECT_LE(static_cast<double>(fallbacks), 0.005 * static_cast<double>(rows));
    EXPECT_LE(nmse(got, want), 1e-10);
  }

  const auto dir = test::scratch_dir("calib_model");
  const std::string out = (dir / "smol.fdpp-calib.json").string();
  write_calibration(c, out);
  EXPECT_EQ(c.path, out);
  expect_same(c, read_calibration(out));
  std::filesystem::remove_all(dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("calibration of the default model (%lld tokens): %.1f s\n", static_cast<long long>(c.tokens), seconds);
}

}  // namespace
}  // namespace fdpp
