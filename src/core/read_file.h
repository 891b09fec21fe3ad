// Reading a whole file, pipe or standard input into memory with a bound: a device such as
// /dev/zero or an endless pipe given as a prompt or a file must end in a one-line error, not in
// exhausted memory; a directory must be named as one, not fail as a "read error".
#pragma once

#include <cstddef>
#include <istream>
#include <string>
#include <string_view>

namespace fdpp {

// Reads `in` to its end. Throws fdpp::Error "NAME: longer than N MiB (...)" past max_bytes (a
// multiple of 1 MiB), "NAME: read error" when the stream fails.
std::string read_all(std::istream& in, size_t max_bytes, std::string_view name);

// Reads the file at path (a regular file, a pipe such as <(cmd), a device). `what` names it in
// errors: "PATH: is a directory, not WHAT", "PATH: cannot open WHAT (No such file or directory)",
// and read_all's.
std::string read_file(const std::string& path, size_t max_bytes, std::string_view what);

}  // namespace fdpp
