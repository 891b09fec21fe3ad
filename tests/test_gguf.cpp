// Tests of the GGUF reader (src/io/gguf.h): metadata round trips through tests/gguf_writer.h,
// v2/v3, alignment, dequantization of every supported type against straightforward references
// written here (fresh random data each run) and against gguf-py (fixtures), hostile files, and the
// real default model when it is present.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fdpp/error.h"
#include "gguf_writer.h"
#include "io/gguf.h"

namespace fdpp::gguf {
namespace {

namespace fs = std::filesystem;
using gguftest::array_payload;
using gguftest::Bytes;
using gguftest::GgufWriter;
using gguftest::nested_array_payload;
using gguftest::string_array_payload;

// ---------------------------------------------------------------------------------------------
// Helpers

std::mt19937_64& rng() {
  static std::mt19937_64 gen = [] {
    const uint64_t seed = std::random_device{}();
    std::printf("test_gguf: random seed %llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return gen;
}

std::vector<float> random_floats(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng());
  return v;
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::uniform_int_distribution<int> dist(0, 255);
  std::vector<uint8_t> v(n);
  for (uint8_t& x : v) x = static_cast<uint8_t>(dist(rng()));
  return v;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "fdpp_gguf_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Writes bytes to a temporary file and opens it (the mmap path).
GgufFile open_file(const std::vector<uint8_t>& bytes, const std::string& name = "t.gguf") {
  static TempDir dir;
  const std::string path = dir.file(name);
  gguftest::write_file(path, bytes);
  return GgufFile::open(path);
}

// Parses bytes from memory (a heap copy of exactly their size); name stands for the path.
GgufFile open_bytes(const std::vector<uint8_t>& bytes, const std::string& name = "t.gguf") {
  return GgufFile::from_bytes(name, bytes);
}

// The fdpp::Error message opening these bytes produces; fails the test if it opens. Both paths
// (file and memory) must give the same message, up to the path.
std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name = "x.gguf") {
  std::string from_memory, from_file;
  try {
    open_bytes(bytes, name);
  } catch (const Error& e) {
    from_memory = e.what();
  }
  try {
    open_file(bytes, name);
  } catch (const Error& e) {
    from_file = e.what();
  }
  if (from_memory.empty() || from_file.empty()) {
    ADD_FAILURE() << "expected fdpp::Error";
    return "";
  }
  EXPECT_EQ(from_file.substr(from_file.size() - from_memory.size()), from_memory);
  EXPECT_NE(from_file.find("/" + name + ": "), std::string::npos) << from_file;
  return from_memory;
}

#define EXPECT_OPEN_ERROR(bytes, substring)                                                      \
  do {                                                                                           \
    const std::string msg_ = open_error(bytes);                                                  \
    EXPECT_NE(msg_.find(substring), std::string::npos) << "message: " << msg_;                  \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << "one line: " << msg_;                      \
    EXPECT_EQ(msg_.rfind("x.gguf: ", 0), 0u) << "names the file: " << msg_;                  \
  } while (0)

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small valid file with metadata of several kinds and three tensors of different types.
GgufWriter small_valid_writer(uint32_t version = 3) {
  GgufWriter w(version);
  w.kv_string("general.architecture", "llama").kv_u32("llama.block_count", 2);
  w.kv_f32("llama.rope.freq_base", 10000.0f).kv_bool("tokenizer.ggml.add_bos_token", true);
  w.kv_string_array("tokenizer.ggml.tokens", {"a", "bc", "<s>"});
  w.kv_array("tokenizer.ggml.token_type", ValueType::I32, std::vector<int>{1, 2, 3});
  w.tensor("norm.weight", {8}, GgmlType::F32, f32_bytes(random_floats(8)));
  w.tensor("q.weight", {32, 2}, GgmlType::Q8_0, random_bytes(2 * 34));
  w.tensor("k.weight", {32}, GgmlType::F16, random_bytes(64));
  return w;
}

// ---------------------------------------------------------------------------------------------
// Reference quantizers (ggml's quantize_row_*_ref, written plainly) and dequantizers (element by
// element, from the block layouts in ggml's ggml-common.h).

uint16_t h(float x) { return f32_to_fp16(x); }
float hf(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return fp16_to_f32(v);
}
void put_h(uint8_t* p, float x) {
  const uint16_t v = h(x);
  std::memcpy(p, &v, 2);
}

std::vector<uint8_t> quantize_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 34);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * 34;
    put_h(blk, d);
    for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[b * 32 + j] * id)));
  }
  return out;
}
float ref_q8_0(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 32 * 34;
  return static_cast<float>(static_cast<int8_t>(blk[2 + e % 32])) * hf(blk);
}

// q4_0/q5_0: d = max / -2^(bits-1) (max: the value of largest magnitude), q = x/d + 2^(bits-1).
template <int kBits>
std::vector<uint8_t> quantize_sym(const std::vector<float>& x) {
  constexpr int bb = kBits == 4 ? 18 : 22, half = 1 << (kBits - 1), qmax = (1 << kBits) - 1;
  std::vector<uint8_t> out(x.size() / 32 * bb, 0);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[b * 32 + j]) > amax) amax = std::fabs(max = x[b * 32 + j]);
    const float d = max / static_cast<float>(-half), id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * bb;
    put_h(blk, d);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = std::min(qmax, static_cast<int>(x[b * 32 + j] * id + static_cast<float>(half) + 0.5f));
      uint8_t* qs = blk + (kBits == 4 ? 2 : 6);
      qs[j % 16] |= static_cast<uint8_t>((q & 15) << (j < 16 ? 0 : 4));
      if (kBits == 5) qh |= static_cast<uint32_t>((q >> 4) & 1) << j;
    }
    if (kBits == 5) std::memcpy(blk + 2, &qh, 4);
  }
  return out;
}
// q4_1/q5_1: d = (max - min) / (2^bits - 1), m = min, q = (x - min) / d.
template <int kBits>
std::vector<uint8_t> quantize_affine(const std::vector<float>& x) {
  constexpr int bb = kBits == 4 ? 20 : 24, qmax = (1 << kBits) - 1;
  std::vector<uint8_t> out(x.size() / 32 * bb, 0);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float lo = x[b * 32], hi = x[b * 32];
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[b * 32 + j]), hi = std::max(hi, x[b * 32 + j]);
    const float d = (hi - lo) / static_cast<float>(qmax), id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * bb;
    put_h(blk, d);
    put_h(blk + 2, lo);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = std::min(qmax, static_cast<int>((x[b * 32 + j] - lo) * id + 0.5f));
      uint8_t* qs = blk + (kBits == 4 ? 4 : 8);
      qs[j % 16] |= static_cast<uint8_t>((q & 15) << (j < 16 ? 0 : 4));
      if (kBits == 5) qh |= static_cast<uint32_t>((q >> 4) & 1) << j;
    }
    if (kBits == 5) std::memcpy(blk + 4, &qh, 4);
  }
  return out;
}

// Element e of a block of 32: its 4 low bits are the low nibble of qs[e] (e < 16) or the high
// nibble of qs[e - 16]; its 5th bit (q5) is bit e of qh.
int nibble(const uint8_t* qs, size_t j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }
int bit5(const uint8_t* qh, size_t j) { return (qh[j / 8] >> (j % 8)) & 1; }

float ref_q4_0(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 32 * 18;
  return static_cast<float>(nibble(blk + 2, e % 32) - 8) * hf(blk);
}
float ref_q4_1(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 32 * 20;
  return static_cast<float>(nibble(blk + 4, e % 32)) * hf(blk) + hf(blk + 2);
}
float ref_q5_0(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 32 * 22;
  return static_cast<float>((nibble(blk + 6, e % 32) | (bit5(blk + 2, e % 32) << 4)) - 16) * hf(blk);
}
float ref_q5_1(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 32 * 24;
  return static_cast<float>(nibble(blk + 8, e % 32) | (bit5(blk + 4, e % 32) << 4)) * hf(blk) + hf(blk + 2);
}

// k-quants: super-blocks of 256 (layouts: ggml-common.h block_q*_K).
float ref_q2_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 84;
  const size_t i = e % 256, g = i / 16;                 // 16 groups of 16
  const size_t half = i / 128, j = (i % 128) / 32, l = i % 32;  // qs[32 half + l], bits 2j
  const int q = (blk[16 + 32 * half + l] >> (2 * j)) & 3;
  const float d = hf(blk + 80), dmin = hf(blk + 82);
  return d * static_cast<float>(blk[g] & 15) * static_cast<float>(q) - dmin * static_cast<float>(blk[g] >> 4);
}
float ref_q3_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 110;
  const size_t i = e % 256, g = i / 16;
  const size_t half = i / 128, j = (i % 128) / 32, l = i % 32;
  const uint8_t* sc = blk + 96;
  const int low = g < 8 ? sc[g] & 15 : sc[g - 8] >> 4;
  const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
  const int scale = (low | (high << 4)) - 32;
  const int q2 = (blk[32 + 32 * half + l] >> (2 * j)) & 3;
  const int hbit = (blk[l] >> (4 * half + j)) & 1;  // hmask[l], bit 4 half + j
  return hf(blk + 108) * static_cast<float>(scale) * static_cast<float>(q2 - (hbit ? 0 : 4));
}
void scale_min(const uint8_t* s, size_t g, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 63, *m = s[g + 4] & 63;
  } else {
    *sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
    *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}
float ref_q4_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 144;
  const size_t i = e % 256, g = i / 32, l = i % 32;  // 8 groups of 32; pairs share qs[32 (g/2) + l]
  int sc, m;
  scale_min(blk + 4, g, &sc, &m);
  const uint8_t byte = blk[16 + 32 * (g / 2) + l];
  const int q = g % 2 == 0 ? byte & 15 : byte >> 4;
  return hf(blk) * static_cast<float>(sc) * static_cast<float>(q) - hf(blk + 2) * static_cast<float>(m);
}
float ref_q5_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 176;
  const size_t i = e % 256, g = i / 32, l = i % 32;
  int sc, m;
  scale_min(blk + 4, g, &sc, &m);
  const uint8_t byte = blk[48 + 32 * (g / 2) + l];
  const int q = (g % 2 == 0 ? byte & 15 : byte >> 4) + (((blk[16 + l] >> g) & 1) << 4);
  return hf(blk) * static_cast<float>(sc) * static_cast<float>(q) - hf(blk + 2) * static_cast<float>(m);
}
float ref_q6_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 210;
  const size_t i = e % 256, half = i / 128, k = (i % 128) / 32, l = i % 32;
  const uint8_t lbyte = blk[64 * half + 32 * (k % 2) + l];
  const int lo = k < 2 ? lbyte & 15 : lbyte >> 4;
  const int hi = (blk[128 + 32 * half + l] >> (2 * k)) & 3;
  const int8_t scale = static_cast<int8_t>(blk[192 + i / 16]);
  return hf(blk + 208) * static_cast<float>(scale) * static_cast<float>((lo | (hi << 4)) - 32);
}
float ref_q8_k(const uint8_t* data, size_t e) {
  const uint8_t* blk = data + e / 256 * 292;
  float d;
  std::memcpy(&d, blk, 4);
  return d * static_cast<float>(static_cast<int8_t>(blk[4 + e % 256]));
}

// Random k-quant blocks: random bytes with finite fp16 (or f32) scales.
std::vector<uint8_t> random_k_blocks(GgmlType t, size_t nb) {
  const size_t bb = block_bytes(t);
  std::vector<uint8_t> out = random_bytes(nb * bb);
  const std::vector<float> s = random_floats(2 * nb, 0.05f);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* blk = out.data() + b * bb;
    switch (t) {
      case GgmlType::Q2_K: put_h(blk + 80, s[2 * b]), put_h(blk + 82, s[2 * b + 1]); break;
      case GgmlType::Q3_K: put_h(blk + 108, s[2 * b]); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K: put_h(blk, s[2 * b]), put_h(blk + 2, s[2 * b + 1]); break;
      case GgmlType::Q6_K: put_h(blk + 208, s[2 * b]); break;
      case GgmlType::Q8_K: std::memcpy(blk, &s[2 * b], 4); break;
      default: break;
    }
  }
  return out;
}

double nmse(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return num / den;
}

// Dequantizes through both dequantize() and GgufFile::read_f32 and compares with ref bit for bit.
void check_dequant(GgmlType type, const std::vector<uint8_t>& data, size_t n,
                   float (*ref)(const uint8_t*, size_t)) {
  SCOPED_TRACE(type_name(type));
  ASSERT_TRUE(is_supported(type));
  ASSERT_EQ(data.size(), n / block_elements(type) * block_bytes(type));
  std::vector<float> out(n, std::nanf("")), via_file(n, std::nanf(""));
  dequantize(type, data.data(), out.data(), n);
  size_t mismatches = 0;
  for (size_t e = 0; e < n; ++e) {
    const float r = ref(data.data(), e);
    if (bits_of(out[e]) != bits_of(r) && mismatches++ < 5)
      ADD_FAILURE() << "element " << e << ": " << out[e] << " vs reference " << r;
  }
  EXPECT_EQ(mismatches, 0u);

  // The same data as a 2-D tensor in a file (rows of 256 or 32 elements).
  const uint64_t row = n % 256 == 0 ? 256 : n % 32 == 0 ? 32 : n;
  GgufWriter w;
  w.tensor("t", {row, n / row}, type, data);
  const GgufFile f = open_bytes(w.build());
  f.read_f32(*f.find_tensor("t"), via_file);
  EXPECT_EQ(std::memcmp(out.data(), via_file.data(), n * 4), 0);
}

// ---------------------------------------------------------------------------------------------
// Metadata

class GgufVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersions, MetadataRoundTripsEveryValueType) {
  const uint32_t version = GetParam();
  std::uniform_int_distribution<uint64_t> u64d;
  const uint64_t r = u64d(rng());
  const float rf = random_floats(1)[0];
  const double rd = static_cast<double>(random_floats(1)[0]) * 1e-3 + 1e-17;
  const std::string s = "héllo\n\"world\" " + std::to_string(r);
  std::vector<std::string> strs = {"", "a", std::string(1000, 'x'), std::string("nul\0byte", 8)};
  std::vector<int64_t> i32s = {-2147483648LL, -1, 0, 7, 2147483647LL};
  std::vector<uint64_t> u64s = {0, 1, r, ~0ull};
  std::vector<float> f32s = random_floats(17);

  GgufWriter w(version);
  w.kv_u8("t.u8", static_cast<uint8_t>(r)).kv_i8("t.i8", -128).kv_u16("t.u16", 65535).kv_i16("t.i16", -32768);
  w.kv_u32("t.u32", static_cast<uint32_t>(r)).kv_i32("t.i32", -123456789).kv_u64("t.u64", r);
  w.kv_i64("t.i64", static_cast<int64_t>(r) | (1ll << 63)).kv_f32("t.f32", rf).kv_f64("t.f64", rd);
  w.kv_bool("t.bool_true", true).kv_bool("t.bool_false", false).kv_string("t.string", s);
  w.kv_string("t.empty_string", "");
  w.kv_array("t.arr_u8", ValueType::U8, std::vector<int>{0, 255, 7});
  w.kv_array("t.arr_i8", ValueType::I8, std::vector<int>{-128, 127});
  w.kv_array("t.arr_u16", ValueType::U16, std::vector<int>{65535});
  w.kv_array("t.arr_i16", ValueType::I16, std::vector<int>{-32768, 32767});
  w.kv_array("t.arr_u32", ValueType::U32, std::vector<uint64_t>{4294967295u, 0});
  w.kv_array("t.arr_i32", ValueType::I32, i32s);
  w.kv_array("t.arr_u64", ValueType::U64, u64s);
  w.kv_array("t.arr_i64", ValueType::I64, std::vector<int64_t>{INT64_MIN, INT64_MAX});
  w.kv_array("t.arr_f32", ValueType::F32, f32s);
  w.kv_array("t.arr_f64", ValueType::F64, std::vector<double>{rd, -0.0, 1e300});
  w.kv_array("t.arr_bool", ValueType::BOOL, std::vector<int>{1, 0, 1, 1});
  w.kv_string_array("t.arr_string", strs);
  w.kv_array("t.arr_empty", ValueType::U32, std::vector<int>{});
  w.kv("t.arr_nested", ValueType::ARRAY,
       nested_array_payload({array_payload(ValueType::U16, std::vector<int>{1, 2}), string_array_payload({"x"}),
                             nested_array_payload({array_payload(ValueType::I8, std::vector<int>{-1})})}));
  const GgufFile f = open_bytes(w.build());

  EXPECT_EQ(f.version(), version);
  EXPECT_EQ(f.keys().size(), 28u);
  EXPECT_EQ(f.keys().front(), "t.u8");
  EXPECT_EQ(f.keys().back(), "t.arr_nested");
  EXPECT_EQ(f.find("absent"), nullptr);
  EXPECT_TRUE(f.tensors().empty());

  auto scalar = [&](const char* key, ValueType t) {
    const Value* v = f.find(key);
    EXPECT_NE(v, nullptr) << key;
    EXPECT_EQ(v->type, t) << key;
    return v;
  };
  EXPECT_EQ(std::get<uint64_t>(scalar("t.u8", ValueType::U8)->data), r & 0xff);
  EXPECT_EQ(std::get<int64_t>(scalar("t.i8", ValueType::I8)->data), -128);
  EXPECT_EQ(std::get<uint64_t>(scalar("t.u16", ValueType::U16)->data), 65535u);
  EXPECT_EQ(std::get<int64_t>(scalar("t.i16", ValueType::I16)->data), -32768);
  EXPECT_EQ(std::get<uint64_t>(scalar("t.u32", ValueType::U32)->data), r & 0xffffffffu);
  EXPECT_EQ(std::get<int64_t>(scalar("t.i32", ValueType::I32)->data), -123456789);
  EXPECT_EQ(std::get<uint64_t>(scalar("t.u64", ValueType::U64)->data), r);
  EXPECT_EQ(std::get<int64_t>(scalar("t.i64", ValueType::I64)->data), static_cast<int64_t>(r) | (1ll << 63));
  EXPECT_EQ(std::get<double>(scalar("t.f32", ValueType::F32)->data), static_cast<double>(rf));
  EXPECT_EQ(std::get<double>(scalar("t.f64", ValueType::F64)->data), rd);
  EXPECT_TRUE(std::get<bool>(scalar("t.bool_true", ValueType::BOOL)->data));
  EXPECT_FALSE(std::get<bool>(scalar("t.bool_false", ValueType::BOOL)->data));
  EXPECT_EQ(std::get<std::string>(scalar("t.string", ValueType::STRING)->data), s);
  EXPECT_EQ(std::get<std::string>(scalar("t.empty_string", ValueType::STRING)->data), "");

  auto array = [&](const char* key, ValueType et) {
    const Value* v = scalar(key, ValueType::ARRAY);
    EXPECT_EQ(v->element_type, et) << key;
    return v;
  };
  EXPECT_EQ(std::get<std::vector<uint64_t>>(array("t.arr_u8", ValueType::U8)->data), (std::vector<uint64_t>{0, 255, 7}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(array("t.arr_i8", ValueType::I8)->data), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(std::get<std::vector<uint64_t>>(array("t.arr_u16", ValueType::U16)->data), (std::vector<uint64_t>{65535}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(array("t.arr_i16", ValueType::I16)->data), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(std::get<std::vector<uint64_t>>(array("t.arr_u32", ValueType::U32)->data),
            (std::vector<uint64_t>{4294967295u, 0}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(array("t.arr_i32", ValueType::I32)->data), i32s);
  EXPECT_EQ(std::get<std::vector<uint64_t>>(array("t.arr_u64", ValueType::U64)->data), u64s);
  EXPECT_EQ(std::get<std::vector<int64_t>>(array("t.arr_i64", ValueType::I64)->data),
            (std::vector<int64_t>{INT64_MIN, INT64_MAX}));
  const auto& f32_back = std::get<std::vector<double>>(array("t.arr_f32", ValueType::F32)->data);
  ASSERT_EQ(f32_back.size(), f32s.size());
  for (size_t i = 0; i < f32s.size(); ++i) EXPECT_EQ(f32_back[i], static_cast<double>(f32s[i]));
  const auto& f64_back = std::get<std::vector<double>>(array("t.arr_f64", ValueType::F64)->data);
  EXPECT_EQ(f64_back, (std::vector<double>{rd, -0.0, 1e300}));
  EXPECT_TRUE(std::signbit(f64_back[1]));
  EXPECT_EQ(std::get<std::vector<bool>>(array("t.arr_bool", ValueType::BOOL)->data),
            (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(std::get<std::vector<std::string>>(array("t.arr_string", ValueType::STRING)->data), strs);
  EXPECT_TRUE(std::get<std::vector<uint64_t>>(array("t.arr_empty", ValueType::U32)->data).empty());
  const auto& nested = std::get<ValueArray>(array("t.arr_nested", ValueType::ARRAY)->data);
  ASSERT_EQ(nested.size(), 3u);
  EXPECT_EQ(nested[0].element_type, ValueType::U16);
  EXPECT_EQ(std::get<std::vector<uint64_t>>(nested[0].data), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(std::get<std::vector<std::string>>(nested[1].data), (std::vector<std::string>{"x"}));
  const auto& inner = std::get<ValueArray>(nested[2].data);
  ASSERT_EQ(inner.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(inner[0].data), (std::vector<int64_t>{-1}));

  // Typed getters.
  EXPECT_EQ(f.get_uint("t.u16"), 65535u);
  EXPECT_EQ(f.get_uint("t.u64"), r);
  EXPECT_EQ(f.get_uint("t.absent", 42), 42u);
  EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(rf));
  EXPECT_EQ(f.get_float("t.f64", 1.5), rd);
  EXPECT_EQ(f.get_float("t.absent", 1.5), 1.5);
  EXPECT_TRUE(f.get_bool("t.bool_true", false));
  EXPECT_TRUE(f.get_bool("t.absent", true));
  EXPECT_EQ(f.get_string("t.string"), s);
  EXPECT_EQ(f.get_string("t.absent", "fb"), "fb");
  EXPECT_EQ(f.get_string_array("t.arr_string"), strs);
  EXPECT_EQ(f.get_int_array("t.arr_i32"), i32s);
  EXPECT_EQ(f.get_int_array("t.arr_u8"), (std::vector<int64_t>{0, 255, 7}));
  EXPECT_EQ(f.get_float_array("t.arr_f64"), (std::vector<double>{rd, -0.0, 1e300}));
  EXPECT_EQ(f.get_float_array("t.arr_f32").size(), f32s.size());
}

INSTANTIATE_TEST_SUITE_P(Gguf, GgufVersions, ::testing::Values(2u, 3u),
                         [](const auto& info) { return fmt::format("v{}", info.param); });

TEST(Gguf, GetterErrorsNameFileKeyAndTypes) {
  GgufWriter w;
  w.kv_i32("neg", -3).kv_i32("pos", 5).kv_string("s", "x").kv_u32("u", 1);
  w.kv_array("big", ValueType::U64, std::vector<uint64_t>{1, ~0ull});
  w.kv_string_array("strs", {"a"});
  const GgufFile f = open_bytes(w.build(), "getters.gguf");
  auto msg = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(f.get_uint("pos"), 5u);
  EXPECT_NE(msg([&] { f.get_uint("missing"); }).find("getters.gguf: metadata missing missing"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_uint("neg"); }).find("metadata neg = -3 is negative"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_uint("s"); }).find("metadata s has type STRING, expected an integer"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_uint("s", 3); }).find("has type STRING"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_float("u"); }).find("metadata u has type U32, expected F32 or F64"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_bool("u", true); }).find("expected BOOL"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_string("u"); }).find("expected STRING"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_string_array("big"); }).find("has type ARRAY of U64, expected ARRAY of STRING"),
            std::string::npos);
  EXPECT_NE(msg([&] { f.get_int_array("big"); }).find("metadata big[1] = 18446744073709551615 does not fit"),
            std::string::npos);
  EXPECT_NE(msg([&] { f.get_float_array("strs"); }).find("expected ARRAY of F32 or F64"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_int_array("strs"); }).find("expected ARRAY of an integer type"), std::string::npos);
}

TEST(Gguf, FormatValue) {
  Value v{ValueType::U32, ValueType::U8, uint64_t{7}};
  EXPECT_EQ(format_value(v), "7");
  v = Value{ValueType::STRING, ValueType::U8, std::string("a\"b\n")};
  EXPECT_EQ(format_value(v), "\"a\\\"b\\n\"");
  v = Value{ValueType::ARRAY, ValueType::STRING, std::vector<std::string>{"a", "b", "c"}};
  EXPECT_EQ(format_value(v, 2), "[3 x STRING: \"a\", \"b\", ...]");
  v = Value{ValueType::ARRAY, ValueType::F32, std::vector<double>{0.5}};
  EXPECT_EQ(format_value(v), "[1 x F32: 0.5]");
  v = Value{ValueType::ARRAY, ValueType::I32, std::vector<int64_t>{}};
  EXPECT_EQ(format_value(v), "[0 x I32]");
  EXPECT_EQ(value_type_name(ValueType::BOOL), "BOOL");
  EXPECT_EQ(value_type_name(static_cast<ValueType>(77)), "value_type#77");
}

// ---------------------------------------------------------------------------------------------
// Layout: versions, alignment, tensor infos

TEST(Gguf, TensorInfosAndDataOffsets) {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w = small_valid_writer(version);
    const std::vector<uint8_t> bytes = w.build();
    const GgufFile f = version == 2 ? open_bytes(bytes) : open_file(bytes);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_offset() % 32, 0u);
    EXPECT_EQ(f.file_size(), bytes.size());
    ASSERT_EQ(f.tensors().size(), 3u);
    const TensorInfo* q = f.find_tensor("q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dims, (std::vector<uint64_t>{32, 2}));
    EXPECT_EQ(q->type, GgmlType::Q8_0);
    EXPECT_EQ(q->n_elements, 64u);
    EXPECT_EQ(q->n_bytes, 68u);
    EXPECT_EQ(q->offset, f.data_offset() + w.offsets()[1]);
    EXPECT_EQ(std::memcmp(f.tensor_bytes(*q).data(), bytes.data() + q->offset, 68), 0);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 3u);
  }
}

// The loader frees the parsed metadata once read (and drops the description's pages of a mapped
// file): no key is found afterwards, and the tensors read as before, from the file and from memory.
TEST(Gguf, ReleasedMetadataKeepsTheTensors) {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w = small_valid_writer(version);
    const std::vector<uint8_t> bytes = w.build();
    GgufFile f = version == 2 ? open_bytes(bytes) : open_file(bytes);
    ASSERT_NE(f.find("tokenizer.ggml.tokens"), nullptr);
    f.release_metadata();
    EXPECT_EQ(f.find("tokenizer.ggml.tokens"), nullptr);
    EXPECT_EQ(f.find("general.architecture"), nullptr);
    EXPECT_TRUE(f.keys().empty());
    ASSERT_EQ(f.tensors().size(), 3u);
    for (const TensorInfo& t : f.tensors())
      EXPECT_EQ(std::memcmp(f.tensor_bytes(t).data(), bytes.data() + t.offset, t.n_bytes), 0) << t.name;
  }
}

TEST(Gguf, MovedFilesKeepTheirBytes) {
  const std::vector<float> x = random_floats(8);
  GgufWriter w;
  w.tensor("a", {8}, GgmlType::F32, f32_bytes(x));
  std::vector<GgufFile> files;
  files.push_back(open_bytes(w.build(), "m.gguf"));
  files.push_back(open_file(w.build(), "m.gguf"));
  files.reserve(64);  // reallocation moves both
  GgufFile moved = std::move(files[0]);
  for (const GgufFile* f : {&moved, &files[1]}) {
    std::vector<float> out(8);
    f->read_f32(f->tensors()[0], out);
    EXPECT_EQ(out, x);
  }
  // tensor_bytes() checks that an info from another file lies inside this one.
  TensorInfo far = moved.tensors()[0];
  far.offset = moved.file_size() - 4;
  EXPECT_THROW(moved.tensor_bytes(far), Error);
}

TEST(Gguf, CustomAlignment) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(align);
    GgufWriter w;
    w.set_alignment(align);
    const std::vector<float> a = random_floats(3), b = random_floats(5);
    w.tensor("a", {3}, GgmlType::F32, f32_bytes(a)).tensor("b", {5}, GgmlType::F32, f32_bytes(b));
    const GgufFile f = open_bytes(w.build());
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_offset() % align, 0u);
    const TensorInfo* tb = f.find_tensor("b");
    EXPECT_EQ((tb->offset - f.data_offset()) % align, 0u);
    EXPECT_EQ(tb->offset - f.data_offset(), (12 + align - 1) / align * align);
    std::vector<float> out(5);
    f.read_f32(*tb, out);
    EXPECT_EQ(out, b);
  }
}

TEST(Gguf, ScalarTensorAndEmptyFileOfTensors) {
  GgufWriter w;
  w.tensor("scalar", {}, GgmlType::F32, f32_bytes({2.5f}));
  const GgufFile f = open_bytes(w.build());
  EXPECT_EQ(f.tensors()[0].n_elements, 1u);
  std::vector<float> out(1);
  f.read_f32(f.tensors()[0], out);
  EXPECT_EQ(out[0], 2.5f);
  // A file with no tensors may end right after its metadata (no data section).
  GgufWriter empty;
  empty.kv_u32("a", 1);
  EXPECT_TRUE(open_bytes(empty.build()).tensors().empty());
}

// ---------------------------------------------------------------------------------------------
// Types and dequantization

TEST(Gguf, TypeTraits) {
  EXPECT_EQ(type_name(GgmlType::Q4_1), "Q4_1");
  EXPECT_EQ(type_name(GgmlType::BF16), "BF16");
  EXPECT_EQ(type_name(static_cast<GgmlType>(99)), "type#99");
  EXPECT_EQ(block_elements(GgmlType::F32), 1u);
  EXPECT_EQ(block_bytes(GgmlType::F32), 4u);
  EXPECT_EQ(block_elements(GgmlType::Q4_1), 32u);
  EXPECT_EQ(block_bytes(GgmlType::Q4_1), 20u);
  EXPECT_EQ(block_bytes(GgmlType::Q6_K), 210u);
  EXPECT_EQ(block_bytes(GgmlType::IQ4_XS), 136u);
  EXPECT_THROW(block_bytes(static_cast<GgmlType>(99)), Error);
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                     GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                     GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_K})
    EXPECT_TRUE(is_supported(t)) << type_name(t);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::IQ2_XXS, GgmlType::IQ4_NL, GgmlType::I32, GgmlType::F64,
                     GgmlType::MXFP4, static_cast<GgmlType>(99)})
    EXPECT_FALSE(is_supported(t)) << type_name(t);
  EXPECT_TRUE(is_known(GgmlType::IQ2_XXS));
  EXPECT_FALSE(is_known(static_cast<GgmlType>(4)));  // Q4_2: removed from ggml
}

TEST(Gguf, DequantF32F16BF16) {
  const size_t n = 1003;  // not a multiple of 8: the F16C path and its scalar tail
  const std::vector<float> x = random_floats(n, 3.0f);
  {
    std::vector<float> out(n);
    dequantize(GgmlType::F32, f32_bytes(x).data(), out.data(), n);
    EXPECT_EQ(out, x);
  }
  // Random finite fp16 and bf16 bit patterns (normals, subnormals, zeros), decoded by formula.
  std::vector<uint8_t> h16(2 * n), b16(2 * n);
  std::vector<float> ref_h(n), ref_b(n);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (size_t i = 0; i < n; ++i) {
    uint16_t hv;
    do hv = static_cast<uint16_t>(bits(rng()));
    while (((hv >> 10) & 31) == 31);
    if (i < 4) hv = std::array<uint16_t, 4>{0x0000, 0x8000, 0x0001, 0x83ff}[i];
    const int e = (hv >> 10) & 31, m = hv & 1023;
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    ref_h[i] = static_cast<float>((hv & 0x8000) ? -mag : mag);
    std::memcpy(&h16[2 * i], &hv, 2);
    const uint16_t bv = static_cast<uint16_t>(bits_of(x[i]) >> 16);
    const uint32_t full = static_cast<uint32_t>(bv) << 16;
    std::memcpy(&ref_b[i], &full, 4);
    std::memcpy(&b16[2 * i], &bv, 2);
  }
  check_dequant(GgmlType::F16, h16, n, [](const uint8_t* d, size_t e) {
    uint16_t hv;
    std::memcpy(&hv, d + 2 * e, 2);
    const int ex = (hv >> 10) & 31, m = hv & 1023;
    const double mag = ex == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, ex - 25);
    return static_cast<float>((hv & 0x8000) ? -mag : mag);
  });
  check_dequant(GgmlType::BF16, b16, n, [](const uint8_t* d, size_t e) {
    uint16_t bv;
    std::memcpy(&bv, d + 2 * e, 2);
    const double mag = ((bv >> 7) & 255) == 0 ? std::ldexp(bv & 127, -133)
                                              : std::ldexp(128 + (bv & 127), ((bv >> 7) & 255) - 134);
    return static_cast<float>((bv & 0x8000) ? -mag : mag);
  });
}

// Quantizes random floats in ggml's layout, checks the library against the element-wise reference
// bit for bit, and checks that the result approximates the input (the layout means what it says).
TEST(Gguf, DequantLegacyQuantsAgainstReference) {
  const size_t n = 256 * 40;
  const std::vector<float> x = random_floats(n);
  struct Case {
    GgmlType type;
    std::vector<uint8_t> data;
    float (*ref)(const uint8_t*, size_t);
    double max_nmse;
  };
  const Case cases[] = {
      {GgmlType::Q8_0, quantize_q8_0(x), ref_q8_0, 1e-4},
      {GgmlType::Q4_0, quantize_sym<4>(x), ref_q4_0, 2e-2},
      {GgmlType::Q4_1, quantize_affine<4>(x), ref_q4_1, 1e-2},
      {GgmlType::Q5_0, quantize_sym<5>(x), ref_q5_0, 5e-3},
      {GgmlType::Q5_1, quantize_affine<5>(x), ref_q5_1, 3e-3},
  };
  for (const Case& c : cases) {
    check_dequant(c.type, c.data, n, c.ref);
    std::vector<float> out(n);
    dequantize(c.type, c.data.data(), out.data(), n);
    EXPECT_LT(nmse(out, x), c.max_nmse) << type_name(c.type);
  }
}

TEST(Gguf, DequantKQuantsAgainstReference) {
  const size_t nb = 24;
  check_dequant(GgmlType::Q2_K, random_k_blocks(GgmlType::Q2_K, nb), nb * 256, ref_q2_k);
  check_dequant(GgmlType::Q3_K, random_k_blocks(GgmlType::Q3_K, nb), nb * 256, ref_q3_k);
  check_dequant(GgmlType::Q4_K, random_k_blocks(GgmlType::Q4_K, nb), nb * 256, ref_q4_k);
  check_dequant(GgmlType::Q5_K, random_k_blocks(GgmlType::Q5_K, nb), nb * 256, ref_q5_k);
  check_dequant(GgmlType::Q6_K, random_k_blocks(GgmlType::Q6_K, nb), nb * 256, ref_q6_k);
  check_dequant(GgmlType::Q8_K, random_k_blocks(GgmlType::Q8_K, nb), nb * 256, ref_q8_k);
}

// Large tensors go through the OpenMP path (64K-element chunks, a ragged last chunk).
TEST(Gguf, DequantLargeTensorsInParallel) {
  const size_t n = 32 * 9001;
  const std::vector<float> x = random_floats(n);
  check_dequant(GgmlType::Q4_1, quantize_affine<4>(x), n, ref_q4_1);
  check_dequant(GgmlType::Q8_0, quantize_q8_0(x), n, ref_q8_0);
  const size_t nk = 256 * 700;
  check_dequant(GgmlType::Q6_K, random_k_blocks(GgmlType::Q6_K, nk / 256), nk, ref_q6_k);
}

// Random blocks dequantized by gguf-py (tests/fixtures/make_gguf_values.py): bit-exact agreement.
TEST(Gguf, DequantMatchesGgufPy) {
  std::ifstream in(std::string(FDPP_TEST_DIR) + "/fixtures/gguf_quant_blocks.json");
  ASSERT_TRUE(in) << "missing tests/fixtures/gguf_quant_blocks.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  size_t types = 0;
  for (const auto& [name, entry] : j.items()) {
    GgmlType type{};
    for (uint32_t t = 0; t < 64; ++t)
      if (type_name(static_cast<GgmlType>(t)) == name) type = static_cast<GgmlType>(t);
    ASSERT_EQ(type_name(type), name);
    const std::string hex = entry["bytes"];
    std::vector<uint8_t> data(hex.size() / 2);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    const std::vector<uint32_t> bits = entry["bits"];
    std::vector<float> out(bits.size());
    dequantize(type, data.data(), out.data(), out.size());
    size_t bad = 0;
    for (size_t i = 0; i < out.size(); ++i)
      if (bits_of(out[i]) != bits[i] && bad++ < 3) ADD_FAILURE() << name << " element " << i;
    EXPECT_EQ(bad, 0u) << name;
    ++types;
  }
  EXPECT_EQ(types, 12u);
}

TEST(Gguf, KnownButUnsupportedTypeParsesAndDequantizeThrows) {
  GgufWriter w;
  w.tensor("iq", {256}, GgmlType::IQ2_XXS, random_bytes(66));
  const GgufFile f = open_file(w.build(), "iq.gguf");
  const TensorInfo& t = f.tensors()[0];
  EXPECT_EQ(t.type, GgmlType::IQ2_XXS);
  EXPECT_EQ(t.n_bytes, 66u);
  std::vector<float> out(256);
  try {
    f.read_f32(t, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq.gguf: tensor 'iq': tensor type IQ2_XXS is not supported"),
              std::string::npos) << e.what();
  }
  try {
    dequantize(GgmlType::Q8_1, random_bytes(36).data(), out.data(), 32);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor type Q8_1 is not supported");
  }
  EXPECT_THROW(dequantize(GgmlType::Q4_0, random_bytes(18).data(), out.data(), 31), Error);
  std::vector<float> wrong(255);
  EXPECT_THROW(f.read_f32(t, wrong), Error);
}

// ---------------------------------------------------------------------------------------------
// Hostile files: each is rejected with fdpp::Error naming the file and the problem.

std::vector<uint8_t> header(uint32_t magic, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  return Bytes().u32(magic).u32(version).u64(n_tensors).u64(n_kv).b;
}

TEST(GgufHostile, EmptyShortAndBadMagic) {
  EXPECT_OPEN_ERROR(std::vector<uint8_t>{}, "x.gguf: empty file");
  EXPECT_OPEN_ERROR((std::vector<uint8_t>{'G', 'G'}), "not a GGUF file (only 2 bytes)");
  EXPECT_OPEN_ERROR(header(0x464c457f, 3, 0, 0), "x.gguf: not a GGUF file (magic 0x464c457f");
  EXPECT_OPEN_ERROR((std::vector<uint8_t>{'G', 'G', 'U', 'F'}), "truncated file: version");
}

TEST(GgufHostile, UnsupportedVersions) {
  EXPECT_OPEN_ERROR(header(0x46554747, 1, 0, 0), "x.gguf: unsupported GGUF version 1");
  EXPECT_OPEN_ERROR(header(0x46554747, 99, 0, 0), "x.gguf: unsupported GGUF version 99");
  EXPECT_OPEN_ERROR(header(0x46554747, 0x03000000, 0, 0), "big-endian");
  GgufWriter w(1);
  EXPECT_OPEN_ERROR(w.build(), "unsupported GGUF version 1");
}

TEST(GgufHostile, TruncatedAtEveryByte) {
  const std::vector<uint8_t> full = small_valid_writer().build();
  ASSERT_NO_THROW(open_bytes(full));
  ASSERT_NO_THROW(open_file(full));
  for (size_t len = 0; len < full.size(); ++len) {
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
    for (bool mapped : {false, true}) {
      try {
        if (mapped) open_file(prefix, "x.gguf");
        else open_bytes(prefix, "x.gguf");
        ADD_FAILURE() << "prefix of " << len << " bytes opened";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("x.gguf: "), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  }
}

TEST(GgufHostile, AbsurdLengthsAndCounts) {
  {  // Key length 2^60.
    Bytes f;
    f.raw(header(0x46554747, 3, 0, 1)).u64(1ull << 60).raw(std::vector<uint8_t>(64, 'a'));
    EXPECT_OPEN_ERROR(f.b, "has length 1152921504606846976, but only 64 bytes are left");
  }
  {  // String value length 2^60.
    GgufWriter w;
    w.kv("s", ValueType::STRING, Bytes().u64(1ull << 60).raw(std::vector<uint8_t>(16, 'x')));
    EXPECT_OPEN_ERROR(w.build(), "string of metadata 's' at offset");
  }
  {  // Array count 2^62.
    GgufWriter w;
    w.kv("a", ValueType::ARRAY, Bytes().type(ValueType::U8).u64(1ull << 62).u8(1).u8(2));
    EXPECT_OPEN_ERROR(w.build(), "array of 4611686018427387904 U8 elements");
  }
  {  // Array count that fits U8s but not the 8-byte minimum of strings.
    GgufWriter w;
    w.kv("a", ValueType::ARRAY, Bytes().type(ValueType::STRING).u64(3).u64(0).u64(0));
    EXPECT_OPEN_ERROR(w.build(), "array of 3 STRING elements needs at least 8 bytes each");
  }
  {  // Nested array count: each inner array needs 12 bytes.
    GgufWriter w;
    w.kv("a", ValueType::ARRAY, Bytes().type(ValueType::ARRAY).u64(1000).raw(std::vector<uint8_t>(100)));
    EXPECT_OPEN_ERROR(w.build(), "array of 1000 ARRAY elements");
  }
  EXPECT_OPEN_ERROR(header(0x46554747, 3, 0, 1ull << 62), "metadata count 4611686018427387904 is impossible");
  EXPECT_OPEN_ERROR(header(0x46554747, 3, ~0ull, 0), "tensor count 18446744073709551615 is impossible");
  {
    GgufWriter w = small_valid_writer();
    w.tensor_count_override = 1000;
    EXPECT_OPEN_ERROR(w.build(), "tensor count 1000 is impossible");
  }
  {
    GgufWriter w = small_valid_writer();
    w.kv_count_override = 7;  // one more than written: the first tensor info is read as a kv
    const std::string msg = open_error(w.build());
    EXPECT_NE(msg.find("x.gguf: "), std::string::npos) << msg;
  }
}

TEST(GgufHostile, BadValues) {
  {
    GgufWriter w;
    w.kv_raw_type("k", 13, Bytes().u32(0));
    EXPECT_OPEN_ERROR(w.build(), "unknown value type 13 (metadata 'k'");
  }
  {
    GgufWriter w;
    w.kv("k", ValueType::ARRAY, Bytes().u32(77).u64(0));
    EXPECT_OPEN_ERROR(w.build(), "array has unknown element type 77");
  }
  {  // Arrays nested 9 deep.
    Bytes p = array_payload(ValueType::U8, std::vector<int>{1});
    for (int i = 0; i < 8; ++i) p = nested_array_payload({p});
    GgufWriter w;
    w.kv("deep", ValueType::ARRAY, p);
    EXPECT_OPEN_ERROR(w.build(), "arrays nested deeper than 8 levels");
    Bytes ok = array_payload(ValueType::U8, std::vector<int>{1});
    for (int i = 0; i < 7; ++i) ok = nested_array_payload({ok});
    GgufWriter w2;
    w2.kv("deep", ValueType::ARRAY, ok);
    EXPECT_NO_THROW(open_bytes(w2.build()));
  }
  {
    GgufWriter w;
    w.kv_u32("a", 1).kv_string("b", "x").kv_u8("a", 2);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: duplicate metadata key 'a'");
  }
  {
    GgufWriter w;
    w.kv_u32("", 1);
    EXPECT_OPEN_ERROR(w.build(), "empty metadata key");
  }
}

// Names come from the file: control bytes are escaped so the message stays one line.
TEST(GgufHostile, NamesInMessagesAreEscaped) {
  {
    GgufWriter w;
    w.kv_u32("a\nb", 1).kv_u32("a\nb", 2);
    EXPECT_OPEN_ERROR(w.build(), "duplicate metadata key 'a\\x0ab'");
  }
  {
    GgufWriter w;
    w.tensor_raw_type("evil\r\nname", {4}, 99, {});
    EXPECT_OPEN_ERROR(w.build(), "tensor 'evil\\x0d\\x0aname' has unknown type 99");
  }
  {
    GgufWriter w;
    w.tensor_raw_type(std::string(5000, 'n'), {4}, 99, {});
    EXPECT_OPEN_ERROR(w.build(), "...(5000 bytes)' has unknown type 99");
  }
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 0xffffffffu}) {
    GgufWriter w;
    w.kv_u32("general.alignment", a);
    EXPECT_OPEN_ERROR(w.build(), fmt::format("general.alignment = {} is not a power of two", a));
  }
  GgufWriter w;
  w.kv_u64("general.alignment", 32);
  EXPECT_OPEN_ERROR(w.build(), "general.alignment has type U64, expected U32");
}

TEST(GgufHostile, BadTensorInfos) {
  const std::vector<uint8_t> f16 = f32_bytes(random_floats(16));
  {
    GgufWriter w;
    w.tensor("t", {2, 2, 2, 2, 1}, GgmlType::F32, f16);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: tensor 't' has 5 dimensions (at most 4 are allowed)");
  }
  {
    GgufWriter w;
    w.tensor_raw_type("a", {16}, 99, f16);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: tensor 'a' has unknown type 99");
  }
  {
    GgufWriter w;
    w.tensor("a", {1ull << 32, 1ull << 32}, GgmlType::F32, f16);
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' has too many elements");
  }
  {
    GgufWriter w;
    w.tensor("a", {1ull << 31, 1ull << 31, 2}, GgmlType::F32, f16);  // 2^63: past int64
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' has too many elements");
  }
  {
    GgufWriter w;
    w.tensor("a", {~0ull}, GgmlType::F32, f16);
    EXPECT_OPEN_ERROR(w.build(), "too large (negative as int64)");
  }
  {
    GgufWriter w;
    w.tensor("a", {4, 0}, GgmlType::F32, f16);
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' has dimension 1 equal to 0");
  }
  {
    GgufWriter w;
    w.tensor("a", {48}, GgmlType::Q4_0, std::vector<uint8_t>(36));
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' has dims[0] = 48, not a multiple of the Q4_0 block size 32");
  }
  {  // 2^62 F64 elements: n_bytes overflows uint64.
    GgufWriter w;
    w.tensor("a", {1ull << 31, 1ull << 31}, GgmlType::F64, f16);
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' size overflows");
  }
  {
    GgufWriter w;
    w.tensor("a", {4}, GgmlType::F32, f16).tensor("a", {4}, GgmlType::F32, f16);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: duplicate tensor name 'a'");
  }
}

TEST(GgufHostile, BadTensorData) {
  const std::vector<uint8_t> d64 = f32_bytes(random_floats(16));
  {
    GgufWriter w;
    w.tensor("a", {16}, GgmlType::F32, d64).tensor("b", {16}, GgmlType::F32, d64, 8);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: tensor 'b' data offset 8 is not a multiple of the alignment 32");
  }
  {
    GgufWriter w;
    w.tensor("a", {16}, GgmlType::F32, d64, 1ull << 40);
    EXPECT_OPEN_ERROR(w.build(), "tensor 'a' data [offset");
    EXPECT_OPEN_ERROR(w.build(), "starts past the end of the file");
  }
  {
    GgufWriter w;
    w.tensor("a", {16}, GgmlType::F32, d64, ~0ull - 31);  // data start + offset overflows
    EXPECT_OPEN_ERROR(w.build(), "starts past the end of the file");
  }
  {
    GgufWriter w;
    w.tensor("blk.0.attn_q.weight", {1024}, GgmlType::F32, d64);
    const std::vector<uint8_t> b = w.build();
    EXPECT_OPEN_ERROR(b, fmt::format("x.gguf: tensor 'blk.0.attn_q.weight' data [offset {}, 4096 bytes] extends past "
                                     "the end of the file ({} bytes)", b.size() - 64, b.size()));
  }
  {
    GgufWriter w;
    w.tensor("a", {16}, GgmlType::F32, d64, 0).tensor("b", {16}, GgmlType::F32, d64, 32);
    EXPECT_OPEN_ERROR(w.build(), "x.gguf: tensors 'a' [offset");
    EXPECT_OPEN_ERROR(w.build(), "overlap");
  }
  {  // Same offset twice.
    GgufWriter w;
    w.tensor("a", {8}, GgmlType::F32, d64, 0).tensor("b", {8}, GgmlType::F32, d64, 0);
    EXPECT_OPEN_ERROR(w.build(), "overlap");
  }
  {  // Adjacent is fine.
    GgufWriter w;
    w.tensor("a", {16}, GgmlType::F32, d64, 64).tensor("b", {16}, GgmlType::F32, d64, 0);
    EXPECT_NO_THROW(open_bytes(w.build()));
  }
}

// ---------------------------------------------------------------------------------------------
// The real default model (skipped when absent).

std::string default_model_path() {
  const char* cache = std::getenv("FDPP_CACHE");
  std::string dir;
  if (cache != nullptr && *cache != '\0') dir = cache;
  else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') dir = std::string(xdg) + "/fdpp";
  else if (const char* home = std::getenv("HOME")) dir = std::string(home) + "/.cache/fdpp";
  return dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufModel, SmolLM2MatchesGgufPy) {
  const std::string path = default_model_path();
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present (scripts/fetch-default-model.sh)";
  std::ifstream in(std::string(FDPP_TEST_DIR) + "/fixtures/gguf_smollm2_values.json");
  ASSERT_TRUE(in);
  const nlohmann::json j = nlohmann::json::parse(in);

  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 30u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), 49152u);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  const TensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::Q8_0);
  EXPECT_EQ(emb->dims, (std::vector<uint64_t>{576, 49152}));

  for (const auto& [name, e] : j["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(type_name(t->type), e["type"].get<std::string>());
    EXPECT_EQ(t->dims, e["dims"].get<std::vector<uint64_t>>());
    std::vector<float> out(t->n_elements);
    f.read_f32(*t, out);
    auto same = [&](const char* key, size_t start) {
      const std::vector<float> want = e[key].get<std::vector<float>>();
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out[start + i], want[i]) << key << " " << i;
    };
    same("first", 0);
    same("last", out.size() - 64);
    if (e.contains("row1000_first")) same("row1000_first", 576 * 1000);
    double sum = 0;
    for (float v : out) sum += v;
    EXPECT_NEAR(sum, e["sum"].get<double>(), 1e-9 * std::max(1.0, std::fabs(sum)) + 1e-6);
  }

  // Every tensor of the model dequantizes (the time is printed; speed is a benchmark's business,
  // not a test's: a loaded CI machine must not fail it).
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t total = 0;
  std::vector<float> buf;
  for (const TensorInfo& t : f.tensors()) {
    buf.resize(t.n_elements);
    f.read_f32(t, buf);
    total += t.n_elements;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("dequantized %llu elements in %.3f s\n", static_cast<unsigned long long>(total), s);
  EXPECT_EQ(total, 134515008u);
}

}  // namespace
}  // namespace fdpp::gguf
