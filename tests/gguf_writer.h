// Test-side GGUF writer: builds GGUF v2/v3 files in memory, valid or deliberately broken, for the
// reader's tests and the fuzzer's seed corpus. Everything the reader checks can be overridden:
// magic, version, counts, raw value types, dims, tensor type numbers, offsets and data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"

namespace fdpp::gguftest {

using gguf::GgmlType;
using gguf::ValueType;

// Little-endian byte encoder (the test hosts are little-endian, like the format).
struct Bytes {
  std::vector<uint8_t> b;

  template <class T>
  Bytes& put(T v) {
    return append(&v, sizeof(T));
  }
  Bytes& append(const void* p, size_t n) {
    if (n == 0) return *this;
    const size_t at = b.size();
    b.resize(at + n);
    std::memcpy(b.data() + at, p, n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& i8(int8_t v) { return put(v); }
  Bytes& u16(uint16_t v) { return put(v); }
  Bytes& i16(int16_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& i32(int32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& i64(int64_t v) { return put(v); }
  Bytes& f32(float v) { return put(v); }
  Bytes& f64(double v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    return append(s.data(), s.size());
  }
  Bytes& raw(const std::vector<uint8_t>& v) { return append(v.data(), v.size()); }
  Bytes& type(ValueType t) { return u32(static_cast<uint32_t>(t)); }
  size_t size() const { return b.size(); }
};

// Encodes one element of a numeric array of element type et.
template <class T>
void put_element(Bytes& out, ValueType et, T v) {
  switch (et) {
    case ValueType::U8: out.u8(static_cast<uint8_t>(v)); break;
    case ValueType::I8: out.i8(static_cast<int8_t>(v)); break;
    case ValueType::U16: out.u16(static_cast<uint16_t>(v)); break;
    case ValueType::I16: out.i16(static_cast<int16_t>(v)); break;
    case ValueType::U32: out.u32(static_cast<uint32_t>(v)); break;
    case ValueType::I32: out.i32(static_cast<int32_t>(v)); break;
    case ValueType::U64: out.u64(static_cast<uint64_t>(v)); break;
    case ValueType::I64: out.i64(static_cast<int64_t>(v)); break;
    case ValueType::F32: out.f32(static_cast<float>(v)); break;
    case ValueType::F64: out.f64(static_cast<double>(v)); break;
    case ValueType::BOOL: out.u8(v ? 1 : 0); break;
    default: throw std::logic_error("put_element: not a numeric type");
  }
}

// The payload of an array value (element type, count, elements), to nest or to pass to kv().
template <class T>
Bytes array_payload(ValueType et, const std::vector<T>& values) {
  Bytes p;
  p.type(et).u64(values.size());
  for (const T& v : values) put_element(p, et, v);
  return p;
}
inline Bytes string_array_payload(const std::vector<std::string>& values) {
  Bytes p;
  p.type(ValueType::STRING).u64(values.size());
  for (const std::string& s : values) p.str(s);
  return p;
}
// An array of arrays: each element is a payload from array_payload/string_array_payload/this.
inline Bytes nested_array_payload(const std::vector<Bytes>& elements) {
  Bytes p;
  p.type(ValueType::ARRAY).u64(elements.size());
  for (const Bytes& e : elements) p.raw(e.b);
  return p;
}

class GgufWriter {
 public:
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; set_alignment() also writes general.alignment
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  explicit GgufWriter(uint32_t v = 3) : version(v) {}

  // A metadata entry whose value bytes (after the u32 type) are given raw.
  GgufWriter& kv(std::string_view key, ValueType type, const Bytes& payload) {
    return kv_raw_type(key, static_cast<uint32_t>(type), payload);
  }
  GgufWriter& kv_raw_type(std::string_view key, uint32_t type, const Bytes& payload) {
    kvs_.str(key).u32(type).raw(payload.b);
    ++n_kv_;
    return *this;
  }
  GgufWriter& kv_u8(std::string_view k, uint8_t v) { return kv(k, ValueType::U8, Bytes().u8(v)); }
  GgufWriter& kv_i8(std::string_view k, int8_t v) { return kv(k, ValueType::I8, Bytes().i8(v)); }
  GgufWriter& kv_u16(std::string_view k, uint16_t v) { return kv(k, ValueType::U16, Bytes().u16(v)); }
  GgufWriter& kv_i16(std::string_view k, int16_t v) { return kv(k, ValueType::I16, Bytes().i16(v)); }
  GgufWriter& kv_u32(std::string_view k, uint32_t v) { return kv(k, ValueType::U32, Bytes().u32(v)); }
  GgufWriter& kv_i32(std::string_view k, int32_t v) { return kv(k, ValueType::I32, Bytes().i32(v)); }
  GgufWriter& kv_u64(std::string_view k, uint64_t v) { return kv(k, ValueType::U64, Bytes().u64(v)); }
  GgufWriter& kv_i64(std::string_view k, int64_t v) { return kv(k, ValueType::I64, Bytes().i64(v)); }
  GgufWriter& kv_f32(std::string_view k, float v) { return kv(k, ValueType::F32, Bytes().f32(v)); }
  GgufWriter& kv_f64(std::string_view k, double v) { return kv(k, ValueType::F64, Bytes().f64(v)); }
  GgufWriter& kv_bool(std::string_view k, bool v) { return kv(k, ValueType::BOOL, Bytes().u8(v ? 1 : 0)); }
  GgufWriter& kv_string(std::string_view k, std::string_view v) { return kv(k, ValueType::STRING, Bytes().str(v)); }
  template <class T>
  GgufWriter& kv_array(std::string_view k, ValueType et, const std::vector<T>& values) {
    return kv(k, ValueType::ARRAY, array_payload(et, values));
  }
  GgufWriter& kv_string_array(std::string_view k, const std::vector<std::string>& values) {
    return kv(k, ValueType::ARRAY, string_array_payload(values));
  }
  GgufWriter& set_alignment(uint32_t a) {
    alignment = a;
    return kv_u32("general.alignment", a);
  }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;      // written as given (may disagree with dims/type on purpose)
    std::optional<uint64_t> offset;  // relative to the data section; default: next aligned spot
  };
  GgufWriter& tensor(std::string name, std::vector<uint64_t> dims, GgmlType type, std::vector<uint8_t> data,
                     std::optional<uint64_t> offset = std::nullopt) {
    return tensor_raw_type(std::move(name), std::move(dims), static_cast<uint32_t>(type), std::move(data), offset);
  }
  GgufWriter& tensor_raw_type(std::string name, std::vector<uint64_t> dims, uint32_t type, std::vector<uint8_t> data,
                              std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({std::move(name), std::move(dims), type, std::move(data), offset});
    return *this;
  }

  // Offsets the tensors get (relative to the data section).
  std::vector<uint64_t> offsets() const {
    std::vector<uint64_t> out;
    uint64_t next = 0;
    for (const Tensor& t : tensors_) {
      const uint64_t off = t.offset ? *t.offset : align_up(next);
      out.push_back(off);
      if (!t.offset) next = off + t.data.size();
      else if (off < (1u << 26)) next = std::max(next, off + t.data.size());
    }
    return out;
  }

  std::vector<uint8_t> build() const {
    Bytes out;
    out.u32(magic).u32(version);
    out.u64(tensor_count_override ? *tensor_count_override : tensors_.size());
    out.u64(kv_count_override ? *kv_count_override : n_kv_);
    out.raw(kvs_.b);
    const std::vector<uint64_t> offs = offsets();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      out.str(t.name).u32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out.u64(d);
      out.u32(t.type).u64(offs[i]);
    }
    if (tensors_.empty()) return out.b;
    out.b.resize(align_up(out.size()), 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (offs[i] >= (1u << 26)) continue;  // a hostile offset: nothing is written there
      const size_t at = data_start + offs[i];
      if (out.b.size() < at + tensors_[i].data.size()) out.b.resize(at + tensors_[i].data.size(), 0);
      std::memcpy(out.b.data() + at, tensors_[i].data.data(), tensors_[i].data.size());
    }
    return out.b;
  }

 private:
  uint64_t align_up(uint64_t x) const { return alignment == 0 ? x : (x + alignment - 1) / alignment * alignment; }

  Bytes kvs_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  const size_t n = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (n != bytes.size()) throw std::runtime_error("short write to " + path);
}

}  // namespace fdpp::gguftest
