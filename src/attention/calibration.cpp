#include "attention/calibration.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/cache_dir.h"
#include "core/read_file.h"
#include "fdpp/error.h"
#include "io/json_file.h"

namespace fdpp {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "fdpp-calibration";
constexpr int kVersion = 1;

// Logit histogram: bins 1/8 wide over [-kHistRange, kHistRange), the ends clamped (exact min and
// max are kept beside it).
constexpr float kHistRange = 512.f;
constexpr int kBinsPerUnit = 8;
constexpr int kBins = static_cast<int>(2 * kHistRange) * kBinsPerUnit;

int bin_of(float x) {
  const int b = static_cast<int>(std::floor((x + kHistRange) * kBinsPerUnit));
  return std::clamp(b, 0, kBins - 1);
}

const std::vector<std::pair<std::string, double>>& quantile_points() {
  static const std::vector<std::pair<std::string, double>> q = {
      {"min", 0.0}, {"p0.1", 0.001}, {"p1", 0.01}, {"p50", 0.5}, {"p99", 0.99}, {"p99.9", 0.999}, {"max", 1.0}};
  return q;
}

// Quantile of sorted values (nearest rank, linear between neighbours).
float quantile_sorted(const std::vector<float>& s, double p) {
  if (s.empty()) return 0.f;
  const double pos = p * static_cast<double>(s.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  const size_t j = std::min(i + 1, s.size() - 1);
  const double f = pos - static_cast<double>(i);
  return static_cast<float>(s[i] * (1.0 - f) + s[j] * f);
}

Quantiles quantiles_of(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  Quantiles q;
  for (const auto& [name, p] : quantile_points()) q[name] = quantile_sorted(v, p);
  return q;
}

// Quantiles from the histogram; min and max exact.
Quantiles quantiles_of_hist(const std::vector<int64_t>& hist, float lo, float hi) {
  int64_t total = 0;
  for (int64_t c : hist) total += c;
  Quantiles q;
  for (const auto& [name, p] : quantile_points()) {
    if (p == 0.0) {
      q[name] = lo;
      continue;
    }
    if (p == 1.0) {
      q[name] = hi;
      continue;
    }
    const double target = p * static_cast<double>(total);
    int64_t cum = 0;
    int b = 0;
    for (; b < kBins; ++b) {
      cum += hist[b];
      if (static_cast<double>(cum) >= target) break;
    }
    const float center = (static_cast<float>(b) + 0.5f) / kBinsPerUnit - kHistRange;
    q[name] = std::clamp(center, lo, hi);
  }
  return q;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

void hash_file_ends(uint64_t& h, const fs::path& p, uint64_t size) {
  std::ifstream f(p, std::ios::binary);
  check(f.good(), "{}: cannot open", p.string());
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<char> buf(kChunk);
  f.read(buf.data(), static_cast<std::streamsize>(std::min(size, kChunk)));
  h = fnv1a(h, buf.data(), static_cast<size_t>(f.gcount()));
  if (size > kChunk) {
    const uint64_t start = size - std::min(size - kChunk, kChunk);
    f.clear();
    f.seekg(static_cast<std::streamoff>(start));
    f.read(buf.data(), static_cast<std::streamsize>(size - start));
    h = fnv1a(h, buf.data(), static_cast<size_t>(f.gcount()));
  }
}

// The phi rule for one layer, given its sorted row maxima R and the bounds' a, b:
//  1. phi = the P-th percentile of R (P = 99 by default). The largest term of a typical row,
//     e^(m - phi), is then at most about 1, so the sums sit at the magnitudes the stable softmax
//     produces (largest term ~1, denominator <= len), and the overflow side (where a missed
//     guard would mean inf) keeps almost all of b ~ 65 nats as headroom for rows larger than any
//     seen in calibration, while the underflow side has |a| ~ 58-61 nats below phi, more than the
//     spread of row maxima in real models (a few tens of nats).
//  2. If that leaves the observed extremes min R or max R within kMargin nats of the ends of
//     [phi + a, phi + b], phi is moved (clamped) just enough to restore the margin; when the
//     observed spread is too wide for both margins, phi centres [min R, max R] in [a, b] (equal
//     margins on both sides). Rows beyond the range still fall back, and are counted.
constexpr float kMargin = 8.f;

float choose_phi(const std::vector<float>& sorted_maxima, double percentile, float a, float b) {
  const float p = quantile_sorted(sorted_maxima, percentile / 100.0);
  const float lo = sorted_maxima.front(), hi = sorted_maxima.back();
  const float phi_min = hi - (b - kMargin);  // phi >= this keeps hi - phi <= b - margin
  const float phi_max = lo - (a + kMargin);  // phi <= this keeps lo - phi >= a + margin
  if (phi_min <= phi_max) return std::clamp(p, phi_min, phi_max);
  return 0.5f * ((lo - a) + (hi - b));
}

// Everything recorded for one layer during the forward passes.
struct LayerStats {
  std::vector<std::vector<float>> row_max;  // [head] -> row maxima
  std::vector<std::vector<int64_t>> hist;   // [head] -> logit histogram
  std::vector<float> lo, hi;                // [head] exact logit range
};

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  std::string w = why;
  std::replace(w.begin(), w.end(), '\n', ' ');
  fail("{}: bad calibration file: {}", path, w);
}

nlohmann::ordered_json quantiles_json(const Quantiles& q) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, p] : quantile_points()) {
    (void)p;
    if (auto it = q.find(name); it != q.end()) j[name] = it->second;
  }
  return j;
}

Quantiles quantiles_from_json(const nlohmann::json& j) {
  Quantiles q;
  for (const auto& [name, p] : quantile_points()) {
    (void)p;
    if (j.contains(name)) q[name] = j.at(name).get<float>();
  }
  return q;
}

}  // namespace

double Calibration::fallback_rate() const {
  double fb = 0, rows = 0;
  for (const auto& l : layers) {
    fb += l.fallback_rate * static_cast<double>(l.rows);
    rows += static_cast<double>(l.rows);
  }
  return rows > 0 ? fb / rows : 0.0;
}

float Calibration::phi_min() const {
  float m = INFINITY;
  for (const auto& l : layers) m = std::min(m, l.bounds.phi);
  return m;
}

float Calibration::phi_max() const {
  float m = -INFINITY;
  for (const auto& l : layers) m = std::max(m, l.bounds.phi);
  return m;
}

std::vector<std::string> read_calibration_prompts(const std::string& path) {
  constexpr size_t kMaxPromptsBytes = size_t{64} << 20;  // calibration reads a few hundred KB
  std::istringstream ss(read_file(path, kMaxPromptsBytes, "the prompts file"));
  std::vector<std::string> prompts;
  std::string current, line;
  auto flush = [&] {
    const size_t b = current.find_first_not_of(" \t\r\n");
    if (b != std::string::npos) {
      const size_t e = current.find_last_not_of(" \t\r\n");
      prompts.push_back(current.substr(b, e - b + 1));
    }
    current.clear();
  };
  while (std::getline(ss, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
    } else {
      if (!current.empty()) current += '\n';
      current += line;
    }
  }
  flush();
  check(!prompts.empty(), "{}: no prompts (one per blank-line-separated paragraph)", path);
  return prompts;
}

std::string model_fingerprint(const std::string& model_path, uint64_t* size_out) {
  std::error_code ec;
  const fs::path p(model_path);
  uint64_t h = 0xcbf29ce484222325ULL;
  uint64_t size = 0;
  if (fs::is_directory(p, ec)) {
    std::vector<std::pair<std::string, uint64_t>> files;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.is_regular_file(ec) && !e.path().filename().string().ends_with(".fdpp-calib.json") &&
          e.path().filename() != "fdpp-calib.json")
        files.emplace_back(e.path().filename().string(), e.file_size(ec));
    std::sort(files.begin(), files.end());
    for (const auto& [name, s] : files) {
      h = fnv1a(h, name.data(), name.size());
      h = fnv1a(h, &s, sizeof s);
      size += s;
    }
    if (fs::exists(p / "config.json", ec)) hash_file_ends(h, p / "config.json", fs::file_size(p / "config.json", ec));
  } else {
    size = fs::file_size(p, ec);
    check(!ec, "{}: cannot read the model file ({})", model_path, ec.message());
    h = fnv1a(h, &size, sizeof size);
    hash_file_ends(h, p, size);
  }
  if (size_out) *size_out = size;
  return fmt::format("{:016x}", h);
}

Calibration calibrate_model(const LoadedModel& model, const std::string& model_path,
                            const std::vector<std::string>& prompts, const CalibrationOptions& options,
                            const ObservedRun& run) {
  const ModelConfig& c = model.config();
  check(model.tokenizer != nullptr, "{}: no tokenizer; calibration runs text through the model", model_path);
  check(!prompts.empty(), "calibrate: no prompts");
  check(options.percentile > 0.0 && options.percentile <= 100.0, "calibrate: percentile {} is not in (0, 100]",
        options.percentile);
  int cap = c.max_context;
  if (options.max_tokens_per_prompt > 0) cap = std::min(cap, options.max_tokens_per_prompt);

  std::vector<std::vector<int32_t>> tokenized;
  for (const std::string& p : prompts) {
    std::vector<int32_t> ids = model.tokenizer->encode(p, model.tokenizer->add_bos_by_default(), false);
    if (static_cast<int>(ids.size()) > cap) ids.resize(static_cast<size_t>(cap));
    if (ids.empty()) continue;
    tokenized.push_back(std::move(ids));
  }
  check(!tokenized.empty(), "calibrate: the prompts encode to no tokens");

  const int n_heads = c.n_heads;
  std::vector<LayerStats> stats(static_cast<size_t>(c.n_layers));
  for (auto& s : stats) {
    s.row_max.resize(n_heads);
    s.hist.assign(n_heads, std::vector<int64_t>(kBins, 0));
    s.lo.assign(n_heads, INFINITY);
    s.hi.assign(n_heads, -INFINITY);
  }

  const AttentionObserver observer = [&](const AttentionObservation& o) {
    LayerStats& s = stats[static_cast<size_t>(o.layer)];
    const int group = o.n_heads / o.n_kv_heads;
    const int64_t q_stride = static_cast<int64_t>(o.n_heads) * o.head_dim;
    const int64_t kv_stride = static_cast<int64_t>(o.n_kv_heads) * o.head_dim;
    std::vector<float> maxima(static_cast<size_t>(o.n_q * o.n_heads));
#pragma omp parallel
    {
      std::vector<int64_t> hist(static_cast<size_t>(o.n_heads) * kBins, 0);
      std::vector<float> lo(o.n_heads, INFINITY), hi(o.n_heads, -INFINITY);
#pragma omp for collapse(2) schedule(dynamic, 4)
      for (int64_t t = 0; t < o.n_q; ++t) {
        for (int h = 0; h < o.n_heads; ++h) {
          const float* qh = o.q + t * q_stride + static_cast<int64_t>(h) * o.head_dim;
          const float* kh = o.k + static_cast<int64_t>(h / group) * o.head_dim;
          const int64_t len = o.start_pos + t + 1;
          float m = -INFINITY;
          for (int64_t j = 0; j < len; ++j) {
            const float* kj = kh + j * kv_stride;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int d = 0; d < o.head_dim; ++d) dot += qh[d] * kj[d];
            const float x = dot * o.scale;
            m = std::max(m, x);
            ++hist[static_cast<size_t>(h) * kBins + bin_of(x)];
            lo[h] = std::min(lo[h], x);
            hi[h] = std::max(hi[h], x);
          }
          maxima[static_cast<size_t>(t * o.n_heads + h)] = m;
        }
      }
#pragma omp critical
      for (int h = 0; h < o.n_heads; ++h) {
        for (int b = 0; b < kBins; ++b) s.hist[h][b] += hist[static_cast<size_t>(h) * kBins + b];
        s.lo[h] = std::min(s.lo[h], lo[h]);
        s.hi[h] = std::max(s.hi[h], hi[h]);
      }
    }
    for (int64_t t = 0; t < o.n_q; ++t)
      for (int h = 0; h < o.n_heads; ++h) s.row_max[h].push_back(maxima[static_cast<size_t>(t * o.n_heads + h)]);
  };

  Calibration cal;
  cal.model_path = model_path;
  cal.model_name = c.name.empty() ? c.architecture : c.name;
  cal.model_fingerprint = model_fingerprint(model_path, &cal.model_size);
  cal.max_context = c.max_context;
  cal.percentile = options.percentile;
  run(tokenized, observer);
  for (const auto& ids : tokenized) {
    ++cal.prompts;
    cal.tokens += static_cast<int64_t>(ids.size());
  }

  const UnifiedMaxBounds range = derive_unified_max_bounds(0.f, c.max_context);
  for (int layer = 0; layer < c.n_layers; ++layer) {
    LayerStats& s = stats[static_cast<size_t>(layer)];
    LayerCalibration lc;
    std::vector<float> all;
    std::vector<int64_t> hist(kBins, 0);
    float lo = INFINITY, hi = -INFINITY;
    for (int h = 0; h < n_heads; ++h) {
      HeadCalibration hc;
      std::vector<float> sorted = s.row_max[h];
      std::sort(sorted.begin(), sorted.end());
      hc.phi = choose_phi(sorted, options.percentile, range.a, range.b);
      hc.row_max = quantiles_of(s.row_max[h]);
      hc.logits = quantiles_of_hist(s.hist[h], s.lo[h], s.hi[h]);
      hc.logit_min = s.lo[h];
      hc.logit_max = s.hi[h];
      lc.heads.push_back(hc);
      all.insert(all.end(), s.row_max[h].begin(), s.row_max[h].end());
      for (int b = 0; b < kBins; ++b) hist[b] += s.hist[h][b];
      lo = std::min(lo, s.lo[h]);
      hi = std::max(hi, s.hi[h]);
    }
    std::sort(all.begin(), all.end());
    lc.bounds = range;
    lc.bounds.phi = choose_phi(all, options.percentile, range.a, range.b);
    int64_t outside = 0;
    for (float m : all) outside += !lc.bounds.contains(m);
    lc.rows = static_cast<int64_t>(all.size());
    lc.fallback_rate = lc.rows > 0 ? static_cast<double>(outside) / static_cast<double>(lc.rows) : 0.0;
    lc.row_max = quantiles_of(all);
    lc.logits = quantiles_of_hist(hist, lo, hi);
    cal.layers.push_back(std::move(lc));
  }
  return cal;
}

std::string calibration_path_beside(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) return (fs::path(model_path) / "fdpp-calib.json").string();
  return model_path + ".fdpp-calib.json";
}

std::string calibration_path_in_cache(const std::string& model_path) {
  fs::path p(model_path);
  std::string name = p.filename().string();
  if (name.empty()) name = p.parent_path().filename().string();  // "dir/"
  return (fs::path(cache_dir()) / "calib" / fmt::format("{}-{}.fdpp-calib.json", name, model_fingerprint(model_path)))
      .string();
}

std::string default_calibration_output(const std::string& model_path) {
  const std::string beside = calibration_path_beside(model_path);
  const fs::path dir = fs::path(beside).parent_path().empty() ? fs::path(".") : fs::path(beside).parent_path();
  std::error_code ec;
  const bool writable = fs::exists(beside, ec) ? ::access(beside.c_str(), W_OK) == 0
                                               : ::access(dir.c_str(), W_OK) == 0;
  return writable ? beside : calibration_path_in_cache(model_path);
}

void write_calibration(Calibration& c, const std::string& path) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["model"] = {{"path", c.model_path}, {"name", c.model_name}, {"size", c.model_size},
                {"fingerprint", c.model_fingerprint}};
  j["max_context"] = c.max_context;
  j["percentile"] = c.percentile;
  j["phi_rule"] =
      "phi = percentile P of the layer's per-row max logits, clamped so that the observed row maxima stay 8 nats "
      "inside [phi + a, phi + b] (centred when they cannot)";
  j["prompts"] = c.prompts;
  j["tokens"] = c.tokens;
  j["fallback_rate"] = c.fallback_rate();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerCalibration& l = c.layers[i];
    nlohmann::ordered_json heads = nlohmann::ordered_json::array();
    for (const auto& h : l.heads)
      heads.push_back({{"phi", h.phi},
                       {"row_max", quantiles_json(h.row_max)},
                       {"logits", quantiles_json(h.logits)},
                       {"logit_min", h.logit_min},
                       {"logit_max", h.logit_max}});
    layers.push_back({{"layer", i},
                      {"phi", l.bounds.phi},
                      {"a", l.bounds.a},
                      {"b", l.bounds.b},
                      {"rows", l.rows},
                      {"fallback_rate", l.fallback_rate},
                      {"row_max", quantiles_json(l.row_max)},
                      {"logits", quantiles_json(l.logits)},
                      {"heads", heads}});
  }
  j["layers"] = layers;
  write_file_atomically(path, j.dump(1) + "\n", "the calibration file");
  c.path = path;
}

Calibration read_calibration(const std::string& path) {
  const std::string text = read_file(path, kMaxJsonFileBytes, "the calibration file");
  nlohmann::json j;
  try {
    j = parse_json(text);
  } catch (const JsonSyntaxError& e) {
    bad_file(path, fmt::format("not JSON ({})", e.what()));
  }
  Calibration c;
  c.path = path;
  try {
    if (!j.is_object() || j.value("format", "") != kFormat) bad_file(path, "not an fdpp calibration (format)");
    if (j.at("version").get<int>() != kVersion)
      bad_file(path, fmt::format("version {} (this fdpp reads {})", j.at("version").dump(), kVersion));
    const auto& m = j.at("model");
    c.model_path = m.at("path").get<std::string>();
    c.model_name = m.value("name", "");
    c.model_size = m.at("size").get<uint64_t>();
    c.model_fingerprint = m.at("fingerprint").get<std::string>();
    c.max_context = j.at("max_context").get<int64_t>();
    if (c.max_context < 1) bad_file(path, fmt::format("max_context {} must be positive", c.max_context));
    c.percentile = j.value("percentile", 0.0);
    c.prompts = j.value("prompts", int64_t{0});
    c.tokens = j.value("tokens", int64_t{0});
    const auto& layers = j.at("layers");
    if (!layers.is_array() || layers.empty()) bad_file(path, "no layers");
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& l = layers[i];
      LayerCalibration lc;
      const auto num = [&](const char* key) {
        const auto& v = l.at(key);
        if (!v.is_number()) bad_file(path, fmt::format("layer {}: {} is not a number", i, key));
        const double d = v.get<double>();
        if (!std::isfinite(static_cast<float>(d)))
          bad_file(path, fmt::format("layer {}: {} = {} is not a finite fp32 number", i, key, v.dump()));
        return d;
      };
      lc.bounds.phi = static_cast<float>(num("phi"));
      lc.bounds.a = static_cast<float>(num("a"));
      lc.bounds.b = static_cast<float>(num("b"));
      if (!(lc.bounds.a < 0.f && lc.bounds.b > 0.f))
        bad_file(path, fmt::format("layer {}: range [{}, {}] does not contain 0", i, lc.bounds.a, lc.bounds.b));
      // Never wider than the derivation allows for the recorded context.
      const UnifiedMaxBounds safe = derive_unified_max_bounds(0.f, c.max_context);
      if (lc.bounds.a < safe.a || lc.bounds.b > safe.b)
        bad_file(path, fmt::format("layer {}: range [{}, {}] is wider than the safe [{}, {}] at {} tokens", i,
                                   lc.bounds.a, lc.bounds.b, safe.a, safe.b, c.max_context));
      lc.rows = l.value("rows", int64_t{0});
      lc.fallback_rate = num("fallback_rate");
      if (lc.fallback_rate < 0.0 || lc.fallback_rate > 1.0)
        bad_file(path, fmt::format("layer {}: fallback_rate {} is not in [0, 1]", i, lc.fallback_rate));
      if (l.contains("row_max")) lc.row_max = quantiles_from_json(l.at("row_max"));
      if (l.contains("logits")) lc.logits = quantiles_from_json(l.at("logits"));
      if (l.contains("heads"))
        for (const auto& h : l.at("heads")) {
          HeadCalibration hc;
          hc.phi = h.value("phi", 0.f);
          if (h.contains("row_max")) hc.row_max = quantiles_from_json(h.at("row_max"));
          if (h.contains("logits")) hc.logits = quantiles_from_json(h.at("logits"));
          hc.logit_min = h.value("logit_min", 0.f);
          hc.logit_max = h.value("logit_max", 0.f);
          lc.heads.push_back(hc);
        }
      c.layers.push_back(std::move(lc));
    }
  } catch (const nlohmann::json::exception& e) {
    bad_file(path, e.what());
  }
  return c;
}

Calibration load_calibration(const std::string& model_path, const std::string& file) {
  std::error_code ec;
  check(fs::exists(file, ec), "--calibration {}: no such file", file);
  Calibration c = read_calibration(file);
  if (!model_path.empty()) {
    uint64_t size = 0;
    const std::string fp = model_fingerprint(model_path, &size);
    check(fp == c.model_fingerprint && size == c.model_size,
          "{}: calibration is for another model file ({}, fingerprint {}; this model {}); rerun fdpp calibrate", file,
          c.model_path, c.model_fingerprint, fp);
  }
  return c;
}

std::optional<Calibration> load_calibration(const std::string& model_path) {
  std::error_code ec;
  std::string path = calibration_path_beside(model_path);
  if (!fs::exists(path, ec)) {
    path = calibration_path_in_cache(model_path);
    if (!fs::exists(path, ec)) return std::nullopt;
  }
  Calibration c = read_calibration(path);
  uint64_t size = 0;
  const std::string fp = model_fingerprint(model_path, &size);
  check(fp == c.model_fingerprint && size == c.model_size,
        "{}: calibration is for another model file (fingerprint {}, this model {}); rerun fdpp calibrate", path,
        c.model_fingerprint, fp);
  return c;
}

}  // namespace fdpp
