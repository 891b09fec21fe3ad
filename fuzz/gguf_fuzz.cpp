// libFuzzer target for the GGUF reader: any input must either parse or throw fdpp::Error, with no
// crash, no out-of-bounds read, no UB (ASan + UBSan) and no allocation out of proportion to the
// input (scripts/fuzz.sh runs it with -malloc_limit_mb=64 on inputs of at most 64 KiB).
// The input is parsed from a heap copy of exactly its size (GgufFile::from_bytes), so ASan sees
// a read one byte past the end. After a successful parse, the target checks the reader's
// promises (tensors inside the file, not overlapping) and exercises the getters and read_f32.
//
// Seed mode: FDPP_GGUF_FUZZ_SEEDS=DIR gguf_fuzz writes small valid GGUF files into DIR and exits.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tests/gguf_writer.h"
#include "fdpp/error.h"
#include "io/gguf.h"

namespace {

using namespace fdpp::gguf;
using fdpp::gguftest::array_payload;
using fdpp::gguftest::GgufWriter;
using fdpp::gguftest::nested_array_payload;
using fdpp::gguftest::string_array_payload;

void promise(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gguf_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(seed >> 24);
  }
  return v;
}

// Scale fields must be finite for read_f32 to mean anything, but any bytes are valid input.
std::vector<uint8_t> blocks(GgmlType t, size_t nblocks, uint32_t seed) {
  std::vector<uint8_t> v = pattern(nblocks * block_bytes(t), seed);
  for (size_t b = 0; b < nblocks && block_elements(t) > 1; ++b) v[b * block_bytes(t) + 1] &= 0x3b;
  return v;
}

void write_seeds(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  int n = 0;
  auto save = [&](const GgufWriter& w) {
    fdpp::gguftest::write_file(dir + "/seed" + std::to_string(n++) + ".gguf", w.build());
  };
  {  // Metadata of every value type and three tensors.
    GgufWriter w;
    w.kv_u8("a.u8", 1).kv_i8("a.i8", -1).kv_u16("a.u16", 2).kv_i16("a.i16", -2).kv_u32("a.u32", 3);
    w.kv_i32("a.i32", -3).kv_u64("a.u64", 4).kv_i64("a.i64", -4).kv_f32("a.f32", 0.5f).kv_f64("a.f64", 0.25);
    w.kv_bool("a.bool", true).kv_string("general.architecture", "llama");
    w.kv_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b"});
    w.kv_array("tokenizer.ggml.token_type", ValueType::I32, std::vector<int>{1, 3, 1, 1});
    w.kv_array("tokenizer.ggml.scores", ValueType::F32, std::vector<float>{0, -1, -2, -3});
    w.kv_array("a.u64s", ValueType::U64, std::vector<uint64_t>{1, 2});
    w.kv_array("a.bools", ValueType::BOOL, std::vector<int>{1, 0});
    w.kv("a.nested", ValueType::ARRAY,
         nested_array_payload({array_payload(ValueType::U8, std::vector<int>{1}), string_array_payload({"x"})}));
    w.tensor("norm.weight", {8}, GgmlType::F32, pattern(32, 1));
    w.tensor("q.weight", {32, 2}, GgmlType::Q8_0, blocks(GgmlType::Q8_0, 2, 2));
    w.tensor("k.weight", {16, 2}, GgmlType::F16, blocks(GgmlType::F16, 32, 3));
    save(w);
  }
  {  // Version 2, custom alignment.
    GgufWriter w(2);
    w.set_alignment(64).kv_u32("llama.block_count", 1);
    w.tensor("a", {32}, GgmlType::Q4_0, blocks(GgmlType::Q4_0, 1, 4));
    w.tensor("b", {4, 2}, GgmlType::BF16, pattern(16, 5));
    save(w);
  }
  // One tensor of each supported type (and one known but unsupported).
  uint32_t seed = 10;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                     GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                     GgmlType::Q6_K, GgmlType::Q8_K, GgmlType::IQ4_NL}) {
    GgufWriter w;
    const uint64_t be = block_elements(t) == 1 ? 16 : block_elements(t);
    w.kv_string("general.name", type_name(t));
    w.tensor("t", {be, 2}, t, blocks(t, be / block_elements(t) * 2, seed++));
    save(w);
  }
  {  // Empty: no metadata, no tensors.
    GgufWriter w;
    save(w);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FDPP_GGUF_FUZZ_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const GgufFile f = GgufFile::from_bytes("fuzz.gguf", std::vector<uint8_t>(data, data + size));
    promise(f.version() == 2 || f.version() == 3, "version");
    promise(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment");
    for (const std::string& key : f.keys()) {
      const Value* v = f.find(key);
      promise(v != nullptr, "key found");
      (void)format_value(*v, 4);
      try { (void)f.get_uint(key); } catch (const fdpp::Error&) {}
      try { (void)f.get_float(key); } catch (const fdpp::Error&) {}
      try { (void)f.get_bool(key, false); } catch (const fdpp::Error&) {}
      try { (void)f.get_string(key); } catch (const fdpp::Error&) {}
      try { (void)f.get_string_array(key); } catch (const fdpp::Error&) {}
      try { (void)f.get_float_array(key); } catch (const fdpp::Error&) {}
      try { (void)f.get_int_array(key); } catch (const fdpp::Error&) {}
    }
    uint64_t total = 0;
    for (const TensorInfo& t : f.tensors()) {
      promise(f.find_tensor(t.name) == &t, "tensor found");
      promise(t.offset >= f.data_offset() && t.offset % f.alignment() == 0, "aligned tensor offset");
      promise(t.offset <= size && t.n_bytes <= size - t.offset, "tensor inside the file");
      total += t.n_bytes;
      const std::span<const uint8_t> bytes = f.tensor_bytes(t);
      promise(bytes.size() == t.n_bytes, "tensor_bytes size");
      if (is_supported(t.type) && t.n_elements <= (uint64_t{1} << 22)) {
        std::vector<float> out(t.n_elements);
        f.read_f32(t, out);
      }
    }
    promise(total <= size, "tensors do not overlap");
  } catch (const fdpp::Error& e) {
    const std::string msg = e.what();
    promise(!msg.empty() && msg.find('\n') == std::string::npos, "one-line error");
    promise(msg.rfind("fuzz.gguf: ", 0) == 0, "error names the file");
  }
  return 0;
}
