#include "model/hf_packed_int.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "fdpp/error.h"

namespace fdpp {

namespace {

// AWQ's order: nibble i of word j holds output channel 8j + {0, 2, 4, 6, 1, 3, 5, 7}[i], so channel
// 8j + t is in nibble kAwqNibble[t].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

bool awq(const HfQuantization& q) { return q.quant_method == "awq"; }

int64_t groups_of(int64_t in, const HfQuantization& q) {
  return q.group_size > 0 ? (in + q.group_size - 1) / q.group_size : 1;
}

const SourceTensor* require(const WeightSource& source, const std::string& name, const char* dtype,
                            const std::vector<int64_t>& shape, const std::string& why) {
  const SourceTensor* t = source.find(name);
  check(t != nullptr, "{}: tensor '{}' is missing ({})", source.origin(), name, why);
  check(t->dtype == dtype, "{}: tensor '{}' has dtype {}, expected {} ({})", source.origin(), name, t->dtype, dtype,
        why);
  check(t->shape == shape, "{}: tensor '{}' has shape {}, expected {} ({})", source.origin(), name,
        shape_string(t->shape), shape_string(shape), why);
  return t;
}

// The int32 words of a tensor, read with pread where the source names its file, so that a load does
// not map the whole checkpoint into memory (the page cache keeps it, but not the process's RSS).
std::vector<int32_t> words(const WeightSource& source, const SourceTensor& t) {
  const RawTensorBytes raw = source.raw_bytes(t);
  check(raw.data != nullptr, "{}: tensor '{}' is not stored contiguously (fdpp reads packed integers in place)",
        source.origin(), t.name);
  check(raw.n_bytes == static_cast<uint64_t>(Tensor::numel_of(t.shape)) * 4, "{}: tensor '{}' holds {} bytes, not {}",
        source.origin(), t.name, raw.n_bytes, Tensor::numel_of(t.shape) * 4);
  std::vector<int32_t> w(static_cast<size_t>(raw.n_bytes / 4));
  if (raw.file.empty()) {
    std::memcpy(w.data(), raw.data, raw.n_bytes);
    return w;
  }
  const int fd = ::open(raw.file.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "{}: cannot open {} ({})", source.origin(), raw.file, std::strerror(errno));
  auto* dst = reinterpret_cast<uint8_t*>(w.data());
  for (uint64_t at = 0; at < raw.n_bytes;) {
    const ssize_t got = ::pread(fd, dst + at, raw.n_bytes - at, static_cast<off_t>(raw.file_offset + at));
    if (got <= 0) {
      const int err = errno;
      ::close(fd);
      fail("{}: reading tensor '{}' from {}: {}", source.origin(), t.name, raw.file,
           got == 0 ? "unexpected end of file" : std::strerror(err));
    }
    at += static_cast<uint64_t>(got);
  }
  ::close(fd);
  return w;
}

}  // namespace

bool has_packed_int(const WeightSource& source, const std::string& module) {
  return source.find(module + ".qweight") != nullptr;
}

PackedIntTensors find_packed_int(const WeightSource& source, const std::string& module, int64_t out, int64_t in,
                                 const HfQuantization& q) {
  check(q.packed_int, "{}: '{}' is stored as packed integers (qweight), but config.json has no AWQ or GPTQ "
        "quantization_config", source.origin(), module);
  const int per_word = 32 / q.bits;
  const std::string why =
      fmt::format("{} {}-bit, group size {}, for a [{}, {}] matrix", q.quant_method, q.bits, q.group_size, out, in);
  check(out % per_word == 0 && in % per_word == 0, "{}: '{}' is a [{}, {}] matrix, which {} does not pack ({} values "
        "per word)", source.origin(), module, out, in, q.quant_method, per_word);
  const int64_t groups = groups_of(in, q);
  PackedIntTensors t;
  t.module = module;
  if (awq(q)) {
    t.qweight = require(source, module + ".qweight", "I32", {in, out / per_word}, why);
  } else {
    t.qweight = require(source, module + ".qweight", "I32", {in / per_word, out}, why);
    if (source.find(module + ".g_idx") != nullptr) t.g_idx = require(source, module + ".g_idx", "I32", {in}, why);
  }
  t.qzeros = require(source, module + ".qzeros", "I32", {groups, out / per_word}, why);
  t.scales = source.find(module + ".scales");
  check(t.scales != nullptr, "{}: tensor '{}.scales' is missing ({})", source.origin(), module, why);
  check(t.scales->dtype == "F16" || t.scales->dtype == "BF16" || t.scales->dtype == "F32",
        "{}: tensor '{}' has dtype {}, expected F16 ({})", source.origin(), t.scales->name, t.scales->dtype, why);
  check(t.scales->shape == std::vector<int64_t>({groups, out}), "{}: tensor '{}' has shape {}, expected {} ({})",
        source.origin(), t.scales->name, shape_string(t.scales->shape), shape_string({groups, out}), why);
  check(!q.act_order || q.group_size <= 0 || t.g_idx != nullptr || awq(q),
        "{}: tensor '{}.g_idx' is missing (desc_act is true: the groups follow g_idx)", source.origin(), module);
  return t;
}

UnpackedInt unpack_packed_int(const WeightSource& source, const PackedIntTensors& t, const HfQuantization& q,
                              int64_t out, int64_t in, int64_t row_begin, int64_t rows) {
  check(row_begin >= 0 && rows >= 0 && row_begin + rows <= out, "unpack_packed_int: rows [{}, {}) of '{}' ({} rows)",
        row_begin, row_begin + rows, t.module, out);
  UnpackedInt u;
  u.rows = rows;
  u.cols = in;
  u.groups = groups_of(in, q);
  const int64_t groups = u.groups;
  const int bits = q.bits, per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<float> scales(static_cast<size_t>(groups * out));
  source.read_f32(*t.scales, scales);
  for (const float s : scales)
    check(std::isfinite(s), "{}: tensor '{}' holds {}, not a finite scale", source.origin(), t.scales->name, s);
  // Each input channel's group.
  u.group.resize(static_cast<size_t>(in));
  if (t.g_idx != nullptr) {
    const std::vector<int32_t> g = words(source, *t.g_idx);
    for (int64_t k = 0; k < in; ++k) {
      check(g[k] >= 0 && g[k] < groups, "{}: tensor '{}' gives input channel {} group {}, not in [0, {})",
            source.origin(), t.g_idx->name, k, g[k], groups);
      u.group[static_cast<size_t>(k)] = g[k];
    }
  } else {
    for (int64_t k = 0; k < in; ++k)
      u.group[static_cast<size_t>(k)] = static_cast<int32_t>(q.group_size > 0 ? k / q.group_size : 0);
  }
  // The zero point and scale of each (output channel, group).
  const std::vector<int32_t> zw = words(source, *t.qzeros);
  u.zero.resize(static_cast<size_t>(rows * groups));
  u.scale.resize(static_cast<size_t>(rows * groups));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = row_begin + r, j = n / per_word, slot = n % per_word;
      const int nibble = awq(q) ? kAwqNibble[slot] : static_cast<int>(slot);
      uint32_t z = (static_cast<uint32_t>(zw[g * (out / per_word) + j]) >> (bits * nibble)) & mask;
      if (!awq(q) && q.zeros_minus_one) z = (z + 1) & mask;
      u.zero[static_cast<size_t>(r * groups + g)] = static_cast<uint8_t>(z);
      u.scale[static_cast<size_t>(r * groups + g)] = scales[static_cast<size_t>(g * out + n)];
    }
  const std::vector<int32_t> qw = words(source, *t.qweight);
  u.q.resize(static_cast<size_t>(rows * in));
#pragma omp parallel for schedule(static) if (rows * in >= (int64_t{1} << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = row_begin + r;
    for (int64_t k = 0; k < in; ++k) {
      uint32_t v;
      if (awq(q)) {
        v = (static_cast<uint32_t>(qw[k * (out / 8) + n / 8]) >> (4 * kAwqNibble[n % 8])) & 0xF;
      } else {
        v = (static_cast<uint32_t>(qw[(k / per_word) * out + n]) >> (bits * (k % per_word))) & mask;
      }
      u.q[static_cast<size_t>(r * in + k)] = static_cast<uint8_t>(v);
    }
  }
  return u;
}

void UnpackedInt::dequantize(float* w) const {
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < cols; ++k) {
      const size_t gi = static_cast<size_t>(n * groups + group[static_cast<size_t>(k)]);
      w[n * cols + k] = (static_cast<float>(q[static_cast<size_t>(n * cols + k)]) - static_cast<float>(zero[gi])) *
                        scale[gi];
    }
}

void dequantize_packed_int(const WeightSource& source, const PackedIntTensors& t, const HfQuantization& q,
                           Tensor& dst) {
  check(dst.shape.size() == 2, "dequantize_packed_int: '{}' is not a matrix", t.module);
  const int64_t out = dst.shape[0], in = dst.shape[1];
  unpack_packed_int(source, t, q, out, in, 0, out).dequantize(dst.ptr());
}

}  // namespace fdpp
