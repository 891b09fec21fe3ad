#include "tune_table.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "fdpp/error.h"

namespace fdpp {

namespace fs = std::filesystem;

std::vector<int> parse_m_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    auto number = [&](std::string_view s) {
      int v = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      check(!s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 1 && v <= kDispatchMaxM,
            "{}: '{}' is not an M in [1, {}] or a range A-B", flag, item, kDispatchMaxM);
      return v;
    };
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(number(item));
    } else {
      const int a = number(std::string_view(item).substr(0, dash)), b = number(std::string_view(item).substr(dash + 1));
      check(a <= b && b - a < 100000, "{}: range '{}' is empty or too long", flag, item);
      for (int m = a; m <= b; ++m) out.push_back(m);
    }
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
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
  return merge_adjacent_ranges(r);
}

StaticChoiceLoss static_choice_loss(const ShapeTimes& t, const std::vector<DispatchRange>& chosen_ranges,
                                    const std::function<LinearImpl(int)>& policy) {
  ShapeDispatch chosen;
  chosen.ranges = chosen_ranges;
  StaticChoiceLoss l;
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < t.m.size(); ++i) {
    const double c = t.at(chosen.choose(t.m[i]), i), s = t.at(policy(t.m[i]), i);
    if (!std::isfinite(c) || !std::isfinite(s)) {
      ++l.missing;
      continue;
    }
    const double r = s / c - 1.0;
    if (!(r <= l.worst)) {
      l.worst = r;
      l.at_m = t.m[i];
    }
    sum += r;
    ++n;
  }
  if (n > 0) l.mean = sum / n;
  return l;
}

std::string default_tune_output(const std::string& model_path, const std::string& gpu, int sm_count) {
  if (model_path.empty()) return dispatch_path_in_cache(gpu, sm_count);
  const std::string beside = dispatch_path_beside(model_path);
  const fs::path dir = fs::path(beside).parent_path().empty() ? fs::path(".") : fs::path(beside).parent_path();
  std::error_code ec;
  const bool writable =
      fs::exists(beside, ec) ? ::access(beside.c_str(), W_OK) == 0 : ::access(dir.c_str(), W_OK) == 0;
  return writable ? beside : dispatch_path_in_cache(gpu, sm_count);
}

}  // namespace fdpp
