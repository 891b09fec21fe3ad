// fdpp's one error type. Every failure the user can cause (a bad file, a bad flag, a request that
// does not fit) is reported by throwing fdpp::Error with a message that names the file, tensor,
// shape or value at fault. The CLI prints it as one line and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace fdpp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// check(cond, ...) throws fdpp::Error when cond is false; the message is only formatted on failure.
template <class... Args>
inline void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace fdpp
