#include "engine/stop_strings.h"

#include <algorithm>

namespace fdpp {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return "";
  pending_ += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that a stop string starts with: the next text may complete it.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(s).substr(0, n)) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace fdpp
