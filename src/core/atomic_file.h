// Writing a file so that readers never see half of it: the text goes to a temporary file beside
// the target, which is then renamed over it (calibration files, dispatch tables).
#pragma once

#include <string>
#include <string_view>

namespace fdpp {

// Creates the parent directories; any failure is a one-line fdpp::Error naming the path and
// `what` ("the calibration file"), and leaves no temporary file behind.
void write_file_atomically(const std::string& path, std::string_view text, std::string_view what);

}  // namespace fdpp
