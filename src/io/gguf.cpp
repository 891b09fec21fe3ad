// GGUF reader (see gguf.h). The parser walks the mapped bytes with a cursor that checks every read
// against the bytes left; every count read from the file is bounded by the bytes it needs before
// anything is allocated for it, so the memory a file can make us use is proportional to its size.
#include "io/gguf.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "fdpp/error.h"

namespace fdpp::gguf {

// ---------------------------------------------------------------------------------------------
// Value types

std::string value_type_name(ValueType type) {
  switch (type) {
    case ValueType::U8: return "U8";
    case ValueType::I8: return "I8";
    case ValueType::U16: return "U16";
    case ValueType::I16: return "I16";
    case ValueType::U32: return "U32";
    case ValueType::I32: return "I32";
    case ValueType::F32: return "F32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::U64: return "U64";
    case ValueType::I64: return "I64";
    case ValueType::F64: return "F64";
  }
  return fmt::format("value_type#{}", static_cast<uint32_t>(type));
}

namespace {

bool is_unsigned(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
bool is_signed(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }
bool is_integer(ValueType t) { return is_unsigned(t) || is_signed(t); }

// The fewest bytes one value of this type occupies in the file (0: not a valid type number).
// Used to bound element counts before anything is allocated for them.
uint64_t min_value_bytes(uint32_t t) {
  switch (static_cast<ValueType>(t)) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;                            // u64 length
    case ValueType::ARRAY: return 12;                            // u32 element type + u64 count
  }
  return 0;
}

// A key or tensor name as shown in an error message: control bytes escaped (the message stays one
// line) and long names cut.
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

// Nested arrays are legal but unused by models; bounding the depth bounds the parser's recursion
// (and the destructor's), which a hostile file could otherwise drive into a stack overflow.
constexpr int kMaxArrayDepth = 8;
// Each metadata entry needs at least a u64 key length, a u32 type and a 1-byte value; each tensor
// info a u64 name length, a u32 n_dims, a u32 type and a u64 offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

// Bounds-checked little-endian reader over the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, std::span<const uint8_t> bytes) : path_(path), bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }
  // What is being read, for error messages ("metadata 'general.name'").
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& path() const { return path_; }

  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail("{}: truncated file: {} of {} at offset {} needs {} bytes, only {} left", path_, what,
           context_, pos_, n, left());
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;  // the host is little-endian (x86-64), like the format
  }

  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > left())
      fail("{}: {} of {} at offset {} has length {}, but only {} bytes are left in the file", path_,
           what, context_, pos_ - 8, len, left());
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  [[noreturn]] void error(const std::string& problem) const {
    fail("{}: {} ({} at offset {})", path_, problem, context_, pos_);
  }

 private:
  const std::string& path_;
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  std::string context_;
};

template <class T>
T read_scalar(Cursor& c) {
  return c.read<T>("value");
}

Value read_value(Cursor& c, uint32_t type_number, int depth);

// Reads `count` elements of element type `et` (already bounded by the bytes left). Storage is
// reserved up front only up to kMaxReserve elements (a vocabulary fits); beyond that it grows with
// the elements actually read, so a count that the bytes left could only barely hold costs nothing
// until those bytes have really been parsed.
constexpr uint64_t kMaxReserve = uint64_t{1} << 20;
void read_array_elements(Cursor& c, Value& v, ValueType et, uint64_t count, int depth) {
  const size_t n = static_cast<size_t>(count);
  const size_t reserve = static_cast<size_t>(std::min(count, kMaxReserve));
  switch (et) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64: {
      std::vector<uint64_t> out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i) {
        switch (et) {
          case ValueType::U8: out.push_back(c.read<uint8_t>("array element")); break;
          case ValueType::U16: out.push_back(c.read<uint16_t>("array element")); break;
          case ValueType::U32: out.push_back(c.read<uint32_t>("array element")); break;
          default: out.push_back(c.read<uint64_t>("array element")); break;
        }
      }
      v.data = std::move(out);
      return;
    }
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64: {
      std::vector<int64_t> out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i) {
        switch (et) {
          case ValueType::I8: out.push_back(c.read<int8_t>("array element")); break;
          case ValueType::I16: out.push_back(c.read<int16_t>("array element")); break;
          case ValueType::I32: out.push_back(c.read<int32_t>("array element")); break;
          default: out.push_back(c.read<int64_t>("array element")); break;
        }
      }
      v.data = std::move(out);
      return;
    }
    case ValueType::F32: case ValueType::F64: {
      std::vector<double> out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i)
        out.push_back(et == ValueType::F32 ? c.read<float>("array element")
                                           : c.read<double>("array element"));
      v.data = std::move(out);
      return;
    }
    case ValueType::BOOL: {
      std::vector<bool> out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i) out.push_back(c.read<uint8_t>("array element") != 0);
      v.data = std::move(out);
      return;
    }
    case ValueType::STRING: {
      std::vector<std::string> out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i) out.push_back(c.read_string("array string"));
      v.data = std::move(out);
      return;
    }
    case ValueType::ARRAY: {
      ValueArray out;
      out.reserve(reserve);
      for (size_t i = 0; i < n; ++i) out.push_back(read_value(c, static_cast<uint32_t>(ValueType::ARRAY), depth + 1));
      v.data = std::move(out);
      return;
    }
  }
}

Value read_value(Cursor& c, uint32_t type_number, int depth) {
  if (min_value_bytes(type_number) == 0) c.error(fmt::format("unknown value type {}", type_number));
  Value v;
  v.type = static_cast<ValueType>(type_number);
  switch (v.type) {
    case ValueType::U8: v.data = uint64_t{read_scalar<uint8_t>(c)}; break;
    case ValueType::U16: v.data = uint64_t{read_scalar<uint16_t>(c)}; break;
    case ValueType::U32: v.data = uint64_t{read_scalar<uint32_t>(c)}; break;
    case ValueType::U64: v.data = uint64_t{read_scalar<uint64_t>(c)}; break;
    case ValueType::I8: v.data = int64_t{read_scalar<int8_t>(c)}; break;
    case ValueType::I16: v.data = int64_t{read_scalar<int16_t>(c)}; break;
    case ValueType::I32: v.data = int64_t{read_scalar<int32_t>(c)}; break;
    case ValueType::I64: v.data = int64_t{read_scalar<int64_t>(c)}; break;
    case ValueType::F32: v.data = double{read_scalar<float>(c)}; break;
    case ValueType::F64: v.data = double{read_scalar<double>(c)}; break;
    case ValueType::BOOL: v.data = read_scalar<uint8_t>(c) != 0; break;
    case ValueType::STRING: v.data = c.read_string("string"); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        c.error(fmt::format("arrays nested deeper than {} levels", kMaxArrayDepth));
      const uint32_t et = c.read<uint32_t>("array element type");
      const uint64_t min_bytes = min_value_bytes(et);
      if (min_bytes == 0) c.error(fmt::format("array has unknown element type {}", et));
      const uint64_t count = c.read<uint64_t>("array count");
      // Bound the count by the bytes left before reserving anything for it.
      if (count > c.left() / min_bytes)
        c.error(fmt::format("array of {} {} elements needs at least {} bytes each, but only {} bytes "
                            "are left in the file",
                            count, value_type_name(static_cast<ValueType>(et)), min_bytes, c.left()));
      v.element_type = static_cast<ValueType>(et);
      read_array_elements(c, v, v.element_type, count, depth);
      break;
    }
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Formatting

namespace {

std::string quote(std::string_view s, size_t max_bytes = 60) {
  std::string out = "\"";
  const size_t n = std::min(s.size(), max_bytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch < 0x20 || ch == 0x7f) {
      out += fmt::format("\\x{:02x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  out += '"';
  if (s.size() > max_bytes) out += "...";
  return out;
}

template <class Vec, class F>
std::string format_list(const Vec& items, ValueType et, size_t max_elements, F&& one) {
  std::string out = fmt::format("[{} x {}", items.size(), value_type_name(et));
  const size_t n = std::min(items.size(), max_elements);
  for (size_t i = 0; i < n; ++i) out += (i == 0 ? ": " : ", ") + one(items[i]);
  if (items.size() > n) out += ", ...";
  out += "]";
  return out;
}

}  // namespace

std::string format_value(const Value& v, size_t max_elements) {
  return std::visit(
      [&](const auto& d) -> std::string {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, int64_t>) {
          return fmt::format("{}", d);
        } else if constexpr (std::is_same_v<T, double>) {
          return v.type == ValueType::F32 ? fmt::format("{}", static_cast<float>(d)) : fmt::format("{}", d);
        } else if constexpr (std::is_same_v<T, bool>) {
          return d ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote(d);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          return format_list(d, v.element_type, max_elements, [](const std::string& s) { return quote(s, 30); });
        } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
          return format_list(d, v.element_type, max_elements, [](bool b) { return std::string(b ? "true" : "false"); });
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          return format_list(d, v.element_type, max_elements, [&](double x) {
            return v.element_type == ValueType::F32 ? fmt::format("{}", static_cast<float>(x)) : fmt::format("{}", x);
          });
        } else if constexpr (std::is_same_v<T, ValueArray>) {
          return format_list(d, v.element_type, max_elements,
                             [&](const Value& x) { return format_value(x, max_elements); });
        } else {
          return format_list(d, v.element_type, max_elements, [](auto x) { return fmt::format("{}", x); });
        }
      },
      v.data);
}

// ---------------------------------------------------------------------------------------------
// Parsing

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.image_ = FileImage::map(path);
  f.parse();
  return f;
}

GgufFile GgufFile::from_bytes(std::string name, std::vector<uint8_t> bytes) {
  GgufFile f;
  f.image_ = FileImage::from_bytes(std::move(name), std::move(bytes));
  f.parse();
  return f;
}

void GgufFile::parse() {
  GgufFile& f = *this;
  const std::string& path = image_.name();
  const std::span<const uint8_t> bytes = image_.bytes();
  const uint64_t size = bytes.size();
  if (size == 0) fail("{}: empty file", path);
  if (size < 4) fail("{}: not a GGUF file (only {} bytes)", path, size);
  uint32_t magic;
  std::memcpy(&magic, bytes.data(), 4);
  if (magic != kMagic) fail("{}: not a GGUF file (magic 0x{:08x}, expected 0x{:08x} \"GGUF\")", path, magic, kMagic);

  Cursor c(path, bytes);
  c.set_context("the header");
  c.read<uint32_t>("magic");
  const uint32_t version = c.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    if (version == 0x02000000u || version == 0x03000000u)
      fail("{}: unsupported GGUF version {} (a big-endian file? fdpp reads little-endian GGUF v2 and v3)",
           path, version);
    fail("{}: unsupported GGUF version {} (fdpp reads GGUF versions 2 and 3)", path, version);
  }
  f.version_ = version;
  const uint64_t tensor_count = c.read<uint64_t>("tensor count");
  const uint64_t kv_count = c.read<uint64_t>("metadata count");
  // Bound both counts by the bytes left before looping or allocating on them.
  if (kv_count > c.left() / kMinKvBytes)
    fail("{}: metadata count {} is impossible: {} entries need at least {} bytes each, the file has {} "
         "bytes after the header", path, kv_count, kv_count, kMinKvBytes, c.left());
  if (tensor_count > c.left() / kMinTensorInfoBytes ||
      kv_count * kMinKvBytes + tensor_count * kMinTensorInfoBytes > c.left())
    fail("{}: tensor count {} is impossible: tensor infos need at least {} bytes each, the file has {} "
         "bytes after the header and {} metadata entries", path, tensor_count, kMinTensorInfoBytes, c.left(),
         kv_count);

  // Metadata.
  for (uint64_t i = 0; i < kv_count; ++i) {
    c.set_context(fmt::format("metadata entry #{}", i));
    std::string key = c.read_string("key");
    if (key.empty()) c.error("empty metadata key");
    c.set_context(fmt::format("metadata '{}'", shown(key)));
    if (f.metadata_.count(key) != 0) fail("{}: duplicate metadata key '{}'", path, shown(key));
    const uint32_t type = c.read<uint32_t>("value type");
    Value v = read_value(c, type, 0);
    f.keys_.push_back(key);
    f.metadata_.emplace(std::move(key), std::move(v));
  }

  // Alignment (general.alignment: a nonzero power-of-two u32; default 32).
  if (const Value* a = f.find("general.alignment")) {
    if (a->type != ValueType::U32)
      fail("{}: metadata general.alignment has type {}, expected U32", path, value_type_name(a->type));
    const uint64_t align = std::get<uint64_t>(a->data);
    if (align == 0 || !std::has_single_bit(align))
      fail("{}: metadata general.alignment = {} is not a power of two", path, align);
    f.alignment_ = align;
  }

  // Tensor infos.
  // Not reserved by tensor_count: bounded only by size / 24, it could ask for several times the
  // file's size in TensorInfos before a single one is parsed.
  for (uint64_t i = 0; i < tensor_count; ++i) {
    c.set_context(fmt::format("tensor info #{}", i));
    TensorInfo t;
    t.name = c.read_string("name");
    c.set_context(fmt::format("tensor '{}'", shown(t.name)));
    if (f.tensor_index_.count(t.name) != 0) fail("{}: duplicate tensor name '{}'", path, shown(t.name));
    const uint32_t n_dims = c.read<uint32_t>("n_dims");
    if (n_dims > kMaxDims)
      fail("{}: tensor '{}' has {} dimensions (at most {} are allowed)", path, shown(t.name), n_dims, kMaxDims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("dimension");
      if (dim == 0) fail("{}: tensor '{}' has dimension {} equal to 0", path, shown(t.name), d);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: tensor '{}' has dimension {} = {}, too large (negative as int64)", path, shown(t.name), d, dim);
      if (__builtin_mul_overflow(n_elements, dim, &n_elements) ||
          n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: tensor '{}' has too many elements (the product of its dimensions overflows int64)", path,
             shown(t.name));
      t.dims.push_back(dim);
    }
    const uint32_t type = c.read<uint32_t>("type");
    t.type = static_cast<GgmlType>(type);
    if (!is_known(t.type)) fail("{}: tensor '{}' has unknown type {}", path, shown(t.name), type);
    t.offset = c.read<uint64_t>("offset");  // relative for now

    const uint64_t blck = block_elements(t.type);
    const uint64_t ne0 = t.dims.empty() ? 1 : t.dims[0];
    if (ne0 % blck != 0)
      fail("{}: tensor '{}' has dims[0] = {}, not a multiple of the {} block size {}", path, shown(t.name), ne0,
           type_name(t.type), blck);
    t.n_elements = n_elements;
    if (__builtin_mul_overflow(n_elements / blck, block_bytes(t.type), &t.n_bytes))
      fail("{}: tensor '{}' size overflows", path, shown(t.name));
    if (t.offset % f.alignment_ != 0)
      fail("{}: tensor '{}' data offset {} is not a multiple of the alignment {}", path, shown(t.name), t.offset,
           f.alignment_);
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // Data section: starts at the first aligned offset after the infos (alignment <= 2^31 and pos <=
  // size, so this cannot overflow).
  const uint64_t align = f.alignment_;
  f.data_offset_ = (c.pos() + align - 1) / align * align;
  for (TensorInfo& t : f.tensors_) {
    const uint64_t rel = t.offset;
    uint64_t abs;
    if (__builtin_add_overflow(f.data_offset_, rel, &abs) || abs > size)
      fail("{}: tensor '{}' data [offset {} + {}, {} bytes] starts past the end of the file ({} bytes)",
           path, shown(t.name), f.data_offset_, rel, t.n_bytes, size);
    if (t.n_bytes > size - abs)
      fail("{}: tensor '{}' data [offset {}, {} bytes] extends past the end of the file ({} bytes)", path,
           shown(t.name), abs, t.n_bytes, size);
    t.offset = abs;
  }

  // No two tensors may share bytes.
  std::vector<size_t> order(f.tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = f.tensors_[order[i - 1]];
    const TensorInfo& b = f.tensors_[order[i]];
    if (a.offset + a.n_bytes > b.offset)  // both ends are <= size: no overflow
      fail("{}: tensors '{}' [offset {}, {} bytes] and '{}' [offset {}, {} bytes] overlap", path, shown(a.name),
           a.offset, a.n_bytes, shown(b.name), b.offset, b.n_bytes);
  }
}

// ---------------------------------------------------------------------------------------------
// Lookups

const Value* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const Value& v, const char* expected) {
  std::string actual = value_type_name(v.type);
  if (v.type == ValueType::ARRAY) actual = fmt::format("ARRAY of {}", value_type_name(v.element_type));
  fail("{}: metadata {} has type {}, expected {}", path, shown(key), actual, expected);
}

uint64_t as_uint(const std::string& path, std::string_view key, const Value& v) {
  if (is_unsigned(v.type)) return std::get<uint64_t>(v.data);
  if (is_signed(v.type)) {
    const int64_t x = std::get<int64_t>(v.data);
    if (x < 0) fail("{}: metadata {} = {} is negative, expected an unsigned integer", path, shown(key), x);
    return static_cast<uint64_t>(x);
  }
  wrong_type(path, key, v, "an integer");
}

}  // namespace

uint64_t GgufFile::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  return as_uint(path(), key, *v);
}

uint64_t GgufFile::get_uint(std::string_view key, uint64_t fallback) const {
  const Value* v = find(key);
  return v == nullptr ? fallback : as_uint(path(), key, *v);
}

double GgufFile::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  if (!is_float(v->type)) wrong_type(path(), key, *v, "F32 or F64");
  return std::get<double>(v->data);
}

double GgufFile::get_float(std::string_view key, double fallback) const {
  return find(key) == nullptr ? fallback : get_float(key);
}

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (v == nullptr) return fallback;
  if (v->type != ValueType::BOOL) wrong_type(path(), key, *v, "BOOL");
  return std::get<bool>(v->data);
}

std::string GgufFile::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  if (v->type != ValueType::STRING) wrong_type(path(), key, *v, "STRING");
  return std::get<std::string>(v->data);
}

std::string GgufFile::get_string(std::string_view key, const std::string& fallback) const {
  return find(key) == nullptr ? fallback : get_string(key);
}

const std::vector<std::string>& GgufFile::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  if (v->type != ValueType::ARRAY || v->element_type != ValueType::STRING)
    wrong_type(path(), key, *v, "ARRAY of STRING");
  return std::get<std::vector<std::string>>(v->data);
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  if (v->type != ValueType::ARRAY || !is_float(v->element_type)) wrong_type(path(), key, *v, "ARRAY of F32 or F64");
  return std::get<std::vector<double>>(v->data);
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) fail("{}: metadata {} missing", path(), shown(key));
  if (v->type != ValueType::ARRAY || !is_integer(v->element_type))
    wrong_type(path(), key, *v, "ARRAY of an integer type");
  if (is_signed(v->element_type)) return std::get<std::vector<int64_t>>(v->data);
  const auto& u = std::get<std::vector<uint64_t>>(v->data);
  std::vector<int64_t> out;
  out.reserve(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    if (u[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("{}: metadata {}[{}] = {} does not fit in int64", path(), shown(key), i, u[i]);
    out.push_back(static_cast<int64_t>(u[i]));
  }
  return out;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::release_metadata() {
  std::unordered_map<std::string, Value>().swap(metadata_);
  std::vector<std::string>().swap(keys_);
  if (!on_disk()) return;
  // Clean file pages: anything that reads them again gets them back from the page cache.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(image_.bytes().data());  // a mapping starts on a page
  const uintptr_t e = (b + std::min<uint64_t>(data_offset_, image_.bytes().size())) & ~(page - 1);
  if (b % page == 0 && e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

std::span<const uint8_t> GgufFile::tensor_bytes(const TensorInfo& info) const {
  // info may come from another file: check its extent against this one.
  if (info.offset > image_.bytes().size() || info.n_bytes > image_.bytes().size() - info.offset)
    fail("{}: tensor '{}' data [offset {}, {} bytes] is not inside this file ({} bytes)", path(), shown(info.name),
         info.offset, info.n_bytes, image_.bytes().size());
  return image_.bytes().subspan(static_cast<size_t>(info.offset), static_cast<size_t>(info.n_bytes));
}

void GgufFile::read_f32(const TensorInfo& info, std::span<float> dst) const {
  if (dst.size() != info.n_elements)
    fail("{}: tensor '{}' has {} elements, but the destination holds {} floats", path(), shown(info.name),
         info.n_elements, dst.size());
  if (!is_supported(info.type))
    fail("{}: tensor '{}': tensor type {} is not supported", path(), shown(info.name), type_name(info.type));
  const std::span<const uint8_t> src = tensor_bytes(info);
  const uint64_t need = info.n_elements / block_elements(info.type) * block_bytes(info.type);
  if (info.n_elements % block_elements(info.type) != 0 || src.size() != need)
    fail("{}: tensor '{}' has {} bytes, {} {} elements need {}", path(), shown(info.name), src.size(),
         info.n_elements, type_name(info.type), need);
  dequantize(info.type, src.data(), dst.data(), info.n_elements);
}

}  // namespace fdpp::gguf
