// Stop strings over streamed text: text is given out as soon as it can no longer become part of a
// stop string, and the output ends right before the first stop string found (llama.cpp's and the
// OpenAI API's `stop`). The text pushed must be whole UTF-8 characters (the streaming detokenizer's
// output); what comes out then is too, because a held-back tail starts where a stop string starts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fdpp {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);
  // Adds text and returns what can be emitted now. Once a stop string is found, stopped() is true,
  // the return value ends before it, and later calls return "".
  std::string push(std::string_view text);
  // The held-back tail, at the end of generation (it was a prefix of a stop string, never a whole one).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace fdpp
