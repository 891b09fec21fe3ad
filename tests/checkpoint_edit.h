// Bad checkpoints for the loader tests, made from good fixtures: a copy in a scratch directory,
// then its config.json, its safetensors header or a tensor's bytes edited.
#pragma once

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace fdpp::test {

// A copy of the fixture directory src in a scratch directory named as.
inline std::filesystem::path copy_fixture(const std::filesystem::path& src, const std::string& as) {
  const std::filesystem::path d = scratch_dir(as);
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy_file(e.path(), d / e.path().filename());
  return d;
}

// Rewrites model.safetensors: its header through edit (with the data section's size before the
// append), then the data section as it was, then `append` (n bytes) after it.
inline void rewrite_safetensors(const std::filesystem::path& dir, const std::function<void(nlohmann::json&, uint64_t)>& edit,
                                const void* append = nullptr, size_t n = 0) {
  const std::filesystem::path p = dir / "model.safetensors";
  std::ifstream in(p, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(len));
  edit(header, bytes.size() - 8 - len);
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  const uint64_t m = h.size();
  out.write(reinterpret_cast<const char*>(&m), 8);
  out << h;
  out.write(bytes.data() + 8 + len, static_cast<std::streamsize>(bytes.size() - 8 - len));
  if (n > 0) out.write(static_cast<const char*>(append), static_cast<std::streamsize>(n));
}

// Rewrites model.safetensors' header through edit (the data section stays as it is, so an edit must
// keep every tensor's byte count).
inline void edit_header(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  rewrite_safetensors(dir, [&](nlohmann::json& header, uint64_t) { edit(header); });
}

// Overwrites the first bytes of a tensor's data.
inline void patch_tensor(const std::filesystem::path& dir, const std::string& name, const void* data, size_t n) {
  const std::filesystem::path p = dir / "model.safetensors";
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  uint64_t len;
  f.read(reinterpret_cast<char*>(&len), 8);
  std::string h(len, '\0');
  f.read(h.data(), static_cast<std::streamsize>(len));
  const uint64_t begin = nlohmann::json::parse(h)[name]["data_offsets"][0];
  f.seekp(static_cast<std::streamoff>(8 + len + begin));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

// Adds a tensor to model.safetensors: its bytes appended to the data section, its entry to the
// header (a scale a checkpoint publishes beside the fixture's weights).
inline void add_tensor(const std::filesystem::path& dir, const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, const void* data, size_t n) {
  rewrite_safetensors(
      dir,
      [&](nlohmann::json& header, uint64_t data_bytes) {
        header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_bytes, data_bytes + n}}};
      },
      data, n);
}

inline void edit_config(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(dir / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  edit(c);
  write_text(dir / "config.json", c.dump(2));
}

}  // namespace fdpp::test
