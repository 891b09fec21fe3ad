// safetensors reader (see safetensors.h) and the dtype table of the HF readers.
#include "io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/half.h"
#include "fdpp/error.h"

namespace fdpp::hf {

namespace {

struct DTypeEntry {
  std::string_view name;
  uint32_t bits;
};

constexpr DTypeEntry kDTypes[] = {
    {"BOOL", 8},    {"U8", 8},       {"I8", 8},       {"U16", 16},     {"I16", 16},
    {"U32", 32},    {"I32", 32},     {"U64", 64},     {"I64", 64},     {"F16", 16},
    {"BF16", 16},   {"F32", 32},     {"F64", 64},     {"C64", 64},     {"F8_E4M3", 8},
    {"F8_E5M2", 8}, {"F8_E8M0", 8},  {"F4", 4},       {"F6_E2M3", 6},  {"F6_E3M2", 6},
};

// Below this many elements a conversion runs on one thread (thread start-up costs more).
constexpr uint64_t kParallelMin = uint64_t{1} << 16;

template <class Convert>
void convert_all(const uint8_t* src, float* dst, uint64_t n, size_t elem_bytes, Convert convert) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < count; ++i) dst[i] = convert(src + static_cast<size_t>(i) * elem_bytes);
}

}  // namespace

uint32_t dtype_bits(std::string_view dtype) {
  for (const DTypeEntry& e : kDTypes)
    if (e.name == dtype) return e.bits;
  return 0;
}

bool dtype_readable(std::string_view dtype) { return dtype == "F32" || dtype == "F16" || dtype == "BF16"; }

void to_f32(std::string_view dtype, const uint8_t* src, float* dst, uint64_t n) {
  // An empty tensor has no bytes to convert (and its buffers may be null: memcpy's arguments may
  // not be, even for 0 bytes; the fuzzer found it).
  if (n == 0 && dtype_readable(dtype)) return;
  if (dtype == "F32") {
    std::memcpy(dst, src, n * sizeof(float));  // the host is little-endian, like the formats
  } else if (dtype == "F16") {
    convert_all(src, dst, n, 2, [](const uint8_t* p) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return fp16_to_f32(h);
    });
  } else if (dtype == "BF16") {
    convert_all(src, dst, n, 2, [](const uint8_t* p) {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16_to_f32(b);
    });
  } else {
    fail("dtype {} not supported (fdpp converts F32, F16 and BF16)", shown(dtype));
  }
}

std::string shown(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 || ch == 0x7f || ch == '\\') out += fmt::format("\\x{:02x}", ch);
    else out += static_cast<char>(ch);
  }
  if (s.size() > kMax) out += fmt::format("...({} bytes)", s.size());
  return out;
}

}  // namespace fdpp::hf

namespace fdpp::safetensors {

using hf::shown;
using nlohmann::json;

namespace {

// The header is a flat object of objects holding short arrays; nothing legitimate nests deeper
// than 3. Bounding the depth keeps a hostile header from costing deep recursion anywhere.
constexpr int kMaxJsonDepth = 4;

// A non-negative integer of the header (nlohmann stores those as unsigned).
bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      out = static_cast<uint64_t>(v.get<int64_t>());
      return true;
    }
    return false;
  }
  out = v.get<uint64_t>();
  return true;
}

std::string kind_of(const json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return fmt::format("negative number {}", v.get<int64_t>());
  if (v.is_number_float()) return "non-integer number";
  return std::string(v.type_name());
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.image_ = FileImage::map(path);
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::string name, std::vector<uint8_t> bytes) {
  SafetensorsFile f;
  f.image_ = FileImage::from_bytes(std::move(name), std::move(bytes));
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& path = image_.name();
  const uint64_t size = image_.bytes().size();
  if (size == 0) fail("{}: empty file", path);
  if (size < 8) fail("{}: not a safetensors file (only {} bytes, the header length alone takes 8)", path, size);
  uint64_t header_len;
  std::memcpy(&header_len, image_.bytes().data(), 8);  // little-endian, like the host
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} is larger than the {} bytes safetensors allows (not a safetensors file?)", path,
         header_len, kMaxHeaderBytes);
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes after the length field)", path, header_len,
         size - 8);
  if (header_len < 2) fail("{}: header of {} bytes cannot hold a JSON object", path, header_len);
  data_offset_ = 8 + header_len;
  const uint64_t data_size = size - data_offset_;

  const char* hb = reinterpret_cast<const char*>(image_.bytes().data() + 8);
  if (hb[0] != '{')
    fail("{}: header does not start with '{{' (starts with byte 0x{:02x}; not a safetensors file?)", path,
         static_cast<unsigned char>(hb[0]));
  std::unordered_set<std::string> seen;
  json header;
  try {
    // The callback bounds the nesting and catches duplicate top-level keys, which a plain parse
    // would silently merge (the last one winning).
    json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth > kMaxJsonDepth) fail("{}: header JSON nests deeper than {} levels", path, kMaxJsonDepth);
      if (event == json::parse_event_t::key && depth == 1) {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!seen.insert(key).second) fail("{}: header names tensor '{}' twice", path, shown(key));
      }
      return true;
    };
    header = json::parse(hb, hb + header_len, cb);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, shown(e.what()));
  }
  if (!header.is_object()) fail("{}: header is a JSON {}, not an object", path, header.type_name());

  tensors_.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ is a {}, not an object of strings", path, entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          fail("{}: __metadata__ entry '{}' is a {}, not a string", path, shown(k), v.type_name());
        metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", path, shown(name));
    if (name.empty()) fail("{}: header has a tensor with an empty name", path);
    if (!entry.is_object()) fail("{} is described by a {}, not an object", where, entry.type_name());
    TensorInfo t;
    t.name = name;

    const auto dt = entry.find("dtype");
    if (dt == entry.end()) fail("{} has no dtype", where);
    if (!dt->is_string()) fail("{}: dtype is a {}, not a string", where, dt->type_name());
    t.dtype = dt->get<std::string>();
    const uint32_t bits = hf::dtype_bits(t.dtype);
    if (bits == 0) fail("{} has unknown dtype '{}'", where, shown(t.dtype));

    const auto sh = entry.find("shape");
    if (sh == entry.end()) fail("{} has no shape", where);
    if (!sh->is_array()) fail("{}: shape is a {}, not an array", where, sh->type_name());
    uint64_t numel = 1;
    t.shape.reserve(sh->size());
    for (const json& d : *sh) {
      uint64_t dim;
      if (!as_u64(d, dim)) fail("{}: shape has a {}, not a non-negative integer", where, kind_of(d));
      if (dim > static_cast<uint64_t>(INT64_MAX)) fail("{}: shape dimension {} is too large", where, dim);
      if (__builtin_mul_overflow(numel, dim, &numel))
        fail("{}: shape {} has more elements than 2^64", where, sh->dump());
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    t.n_elements = numel;
    uint64_t total_bits;
    if (__builtin_mul_overflow(numel, uint64_t{bits}, &total_bits))
      fail("{}: shape {} of {} needs more than 2^64 bits", where, sh->dump(), t.dtype);
    if (total_bits % 8 != 0)
      fail("{}: {} elements of {} ({} bits each) do not fill whole bytes", where, numel, t.dtype, bits);
    t.n_bytes = total_bits / 8;

    const auto off = entry.find("data_offsets");
    if (off == entry.end()) fail("{} has no data_offsets", where);
    if (!off->is_array() || off->size() != 2) fail("{}: data_offsets is not an array of two offsets", where);
    uint64_t begin, end;
    if (!as_u64((*off)[0], begin) || !as_u64((*off)[1], end))
      fail("{}: data_offsets {} are not non-negative integers", where, off->dump());
    if (begin > end) fail("{}: data_offsets [{}, {}] end before they begin", where, begin, end);
    if (end > data_size)
      fail("{}: data_offsets [{}, {}] run past the end of the data section ({} bytes)", where, begin, end, data_size);
    if (end - begin != t.n_bytes)
      fail("{}: data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}", where, begin, end, end - begin,
           sh->dump(), t.dtype, t.n_bytes);
    t.offset = data_offset_ + begin;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.n_bytes < b.n_bytes;
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo& a = tensors_[i - 1];
    const TensorInfo& b = tensors_[i];
    if (b.offset < a.offset + a.n_bytes)
      fail("{}: tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap", path, shown(a.name),
           a.offset - data_offset_, a.offset - data_offset_ + a.n_bytes, shown(b.name), b.offset - data_offset_,
           b.offset - data_offset_ + b.n_bytes);
  }
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::tensor_bytes(const TensorInfo& info) const {
  check(info.offset <= image_.bytes().size() && info.n_bytes <= image_.bytes().size() - info.offset,
        "{}: tensor '{}' lies outside the file", image_.name(), shown(info.name));
  return image_.bytes().subspan(info.offset, info.n_bytes);
}

void SafetensorsFile::read_f32(const TensorInfo& info, std::span<float> dst) const {
  if (dst.size() != info.n_elements)
    fail("{}: tensor '{}' has {} elements, but the destination holds {}", image_.name(), shown(info.name), info.n_elements,
         dst.size());
  if (!hf::dtype_readable(info.dtype))
    fail("{}: tensor '{}': dtype {} not supported (fdpp converts F32, F16 and BF16)", image_.name(), shown(info.name),
         info.dtype);
  const std::span<const uint8_t> src = tensor_bytes(info);
  hf::to_f32(info.dtype, src.data(), dst.data(), info.n_elements);
}

}  // namespace fdpp::safetensors
