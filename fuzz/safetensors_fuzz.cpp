// libFuzzer target for the safetensors reader: any input must either parse or throw fdpp::Error,
// with no crash, no out-of-bounds read, no UB (ASan + UBSan) and no allocation out of proportion
// to the input (scripts/fuzz.sh: inputs of at most 64 KiB, -malloc_limit_mb=64). The input is
// parsed from a heap copy of exactly its size (SafetensorsFile::from_bytes), so ASan sees a read
// one byte past the end. After a successful parse the target checks the reader's promises (spans
// inside the data section, exactly numel * dtype size long, not overlapping) and reads every
// F32/F16/BF16 tensor.
//
// Seed mode: FDPP_SAFETENSORS_FUZZ_SEEDS=DIR safetensors_fuzz writes small valid files into DIR.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fdpp/error.h"
#include "io/safetensors.h"

namespace {

using fdpp::safetensors::SafetensorsFile;
using fdpp::safetensors::TensorInfo;
using nlohmann::json;

void promise(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "safetensors_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

std::vector<uint8_t> make_file(const json& header, size_t data_bytes) {
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h += ' ';
  std::vector<uint8_t> out(8 + h.size() + data_bytes);
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  uint32_t seed = 7;
  for (size_t i = 8 + h.size(); i < out.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>(seed >> 24);
  }
  return out;
}

void write_seeds(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  int n = 0;
  const auto save = [&](const std::vector<uint8_t>& b) {
    std::ofstream f(dir + "/seed" + std::to_string(n++) + ".safetensors", std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  save(make_file({{"__metadata__", {{"format", "pt"}}},
                  {"model.embed_tokens.weight", {{"dtype", "BF16"}, {"shape", {8, 4}}, {"data_offsets", {0, 64}}}},
                  {"model.norm.weight", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {64, 80}}}},
                  {"lm_head.weight", {{"dtype", "F16"}, {"shape", {8, 4}}, {"data_offsets", {80, 144}}}}},
                 144));
  save(make_file({{"a", {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}},
                  {"b", {{"dtype", "BOOL"}, {"shape", {3}}, {"data_offsets", {16, 19}}}},
                  {"c", {{"dtype", "F8_E4M3"}, {"shape", {1, 1}}, {"data_offsets", {19, 20}}}},
                  {"d", {{"dtype", "F4"}, {"shape", {2}}, {"data_offsets", {20, 21}}}},
                  {"e", {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {24, 28}}}},
                  {"f", {{"dtype", "F16"}, {"shape", {0, 5}}, {"data_offsets", {28, 28}}}}},
                 28));
  save(make_file(json::object(), 0));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FDPP_SAFETENSORS_FUZZ_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const SafetensorsFile f = SafetensorsFile::from_bytes("fuzz.safetensors", std::vector<uint8_t>(data, data + size));
    promise(f.data_offset() >= 8 && f.data_offset() <= size, "data section inside the file");
    uint64_t prev_end = f.data_offset();
    for (const TensorInfo& t : f.tensors()) {
      promise(f.find(t.name) == &t, "tensor found");
      promise(t.offset >= prev_end, "tensors in order, not overlapping");
      promise(t.offset <= size && t.n_bytes <= size - t.offset, "tensor inside the file");
      prev_end = t.offset + t.n_bytes;
      const uint32_t bits = fdpp::hf::dtype_bits(t.dtype);
      promise(bits != 0 && t.n_elements * bits == t.n_bytes * 8, "span is numel * dtype size");
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        promise(d >= 0, "non-negative shape");
        numel *= static_cast<uint64_t>(d);
      }
      promise(numel == t.n_elements, "numel is the shape's product");
      promise(f.tensor_bytes(t).size() == t.n_bytes, "tensor_bytes size");
      std::vector<float> out(t.n_elements);
      try {
        f.read_f32(t, out);
        promise(fdpp::hf::dtype_readable(t.dtype), "only F32/F16/BF16 read");
      } catch (const fdpp::Error&) {
        promise(!fdpp::hf::dtype_readable(t.dtype), "readable dtypes read");
      }
    }
  } catch (const fdpp::Error& e) {
    const std::string msg = e.what();
    promise(!msg.empty() && msg.find('\n') == std::string::npos, "one-line error");
    promise(msg.rfind("fuzz.safetensors: ", 0) == 0, "error names the file");
  }
  return 0;
}
