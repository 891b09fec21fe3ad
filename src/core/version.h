#pragma once
// fdpp's version, as `fdpp --version` and the server's GET /version give it (pyproject.toml's
// `version` names the same release for the Python package).
namespace fdpp {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace fdpp
