// ggml tensor types: names, block layouts, and dequantization to float32.
//
// Every dequantizer computes in fp32 with the same operations, in the same order, as ggml's
// reference dequantize_row_* (ggml-quants.c), so results are bit-identical to ggml's and to the
// gguf Python package's (tests/fixtures check both). For that, the compiler must not contract
// d * q + m into a fused multiply-add (one rounding instead of two): fdpp is built with
// -march=x86-64-v3, which has FMA, and GCC contracts across statements by default in C++.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cstring>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/half.h"
#include "fdpp/error.h"
#include "io/gguf.h"

namespace fdpp::gguf {
namespace {

// Dequantizes nb whole blocks from src (nb * block_bytes bytes) into dst (nb * block_elements).
using BlockFn = void (*)(const uint8_t* src, float* dst, uint64_t nb);

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

constexpr int QK = 32;    // elements per block of the legacy quants
constexpr int QK_K = 256;  // elements per super-block of the k-quants

void deq_f32(const uint8_t* src, float* dst, uint64_t nb) { std::memcpy(dst, src, nb * 4); }

void deq_f16(const uint8_t* src, float* dst, uint64_t nb) {
  // GGUF aligns tensor data (32 bytes by default), so the halves are 2-byte aligned.
  fp16_to_f32_row(reinterpret_cast<const uint16_t*>(src), dst, static_cast<int64_t>(nb));
}

void deq_bf16(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    dst[i] = bf16_to_f32(b);
  }
}

// block_q8_0 {fp16 d; int8 qs[32]}: x = q * d
void deq_q8_0(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 34, dst += QK) {
    const float d = half_at(src);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < QK; ++j) dst[j] = static_cast<float>(q[j]) * d;
  }
}

// block_q4_0 {fp16 d; uint8 qs[16]}: low nibbles are elements 0..15, high nibbles 16..31;
// x = (q - 8) * d
void deq_q4_0(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 18, dst += QK) {
    const float d = half_at(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < QK / 2; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      dst[j + QK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// block_q4_1 {fp16 d; fp16 m; uint8 qs[16]}: x = q * d + m (same nibble order as q4_0)
void deq_q4_1(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 20, dst += QK) {
    const float d = half_at(src);
    const float m = half_at(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < QK / 2; ++j) {
      dst[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      dst[j + QK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// block_q5_0 {fp16 d; uint8 qh[4]; uint8 qs[16]}: bit j of the little-endian u32 qh is the 5th bit
// of element j; x = (q - 16) * d
void deq_q5_0(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 22, dst += QK) {
    const float d = half_at(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      dst[j] = static_cast<float>(((qs[j] & 0x0F) | h0) - 16) * d;
      dst[j + QK / 2] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

// block_q5_1 {fp16 d; fp16 m; uint8 qh[4]; uint8 qs[16]}: x = q * d + m
void deq_q5_1(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 24, dst += QK) {
    const float d = half_at(src);
    const float m = half_at(src + 2);
    uint32_t qh;
    std::memcpy(&qh, src + 4, 4);
    const uint8_t* qs = src + 8;
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      dst[j] = static_cast<float>((qs[j] & 0x0F) | h0) * d + m;
      dst[j + QK / 2] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
    }
  }
}

// block_q2_K {uint8 scales[16]; uint8 qs[64]; fp16 d; fp16 dmin}: 16 groups of 16; group g has
// scale (scales[g] & 15) * d and min (scales[g] >> 4) * dmin; the 2-bit quants of element
// 128h + 32j + l (l < 32) sit at bits 2j of qs[32h + l]. x = dl * q - ml
void deq_q2_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 84) {
    const uint8_t* scales = src;
    const uint8_t* q = src + 16;
    const float d = half_at(src + 80);
    const float dmin = half_at(src + 82);
    int g = 0;
    for (int h = 0; h < QK_K / 128; ++h, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half, ++g) {
          const float dl = d * static_cast<float>(scales[g] & 0x0F);
          const float ml = dmin * static_cast<float>(scales[g] >> 4);
          for (int l = 0; l < 16; ++l)
            *dst++ = dl * static_cast<float>((q[16 * half + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// block_q3_K {uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; fp16 d}: 16 groups of 16 with
// 6-bit signed scales (offset 32) packed as low nibbles in bytes 0..7 and high 2-bit pairs in
// bytes 8..11; quants are 2 low bits from qs plus a high bit from hmask (set: +0, clear: -4).
void deq_q3_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 110) {
    const uint8_t* hm = src;
    const uint8_t* q = src + 32;
    const uint8_t* sc = src + 96;
    const float d = half_at(src + 108);
    int scale[16];
    for (int g = 0; g < 16; ++g) {
      const int low = g < 8 ? (sc[g] & 0x0F) : (sc[g - 8] >> 4);
      const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
      scale[g] = (low | (high << 4)) - 32;
    }
    int g = 0;
    uint8_t bit = 1;
    for (int h = 0; h < QK_K / 128; ++h, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, bit = static_cast<uint8_t>(bit << 1)) {
        for (int half = 0; half < 2; ++half, ++g) {
          const float dl = d * static_cast<float>(scale[g]);
          for (int l = 0; l < 16; ++l) {
            const int idx = 16 * half + l;
            const int v = ((q[idx] >> shift) & 3) - ((hm[idx] & bit) ? 0 : 4);
            *dst++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

// The 8 6-bit scales and mins of q4_K/q5_K, packed in 12 bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// block_q4_K {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qs[128]}: 8 groups of 32; element
// 64p + l has the low nibble of qs[32p + l], element 64p + 32 + l the high one.
// x = (d * sc) * q - (dmin * m)
void deq_q4_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 144) {
    const float d = half_at(src);
    const float dmin = half_at(src + 2);
    const uint8_t* s = src + 4;
    const uint8_t* q = src + 16;
    for (int p = 0; p < 4; ++p, q += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * p, s, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * p + 1, s, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// block_q5_K {fp16 d; fp16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}: as q4_K plus a
// 5th bit: bit 2p of qh[l] for element 64p + l, bit 2p+1 for element 64p + 32 + l.
void deq_q5_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 176) {
    const float d = half_at(src);
    const float dmin = half_at(src + 2);
    const uint8_t* s = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    for (int p = 0; p < 4; ++p, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * p, s, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * p + 1, s, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      const int b1 = 2 * p, b2 = 2 * p + 1;
      for (int l = 0; l < 32; ++l)
        *dst++ = d1 * static_cast<float>((ql[l] & 0x0F) + (((qh[l] >> b1) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *dst++ = d2 * static_cast<float>((ql[l] >> 4) + (((qh[l] >> b2) & 1) << 4)) - m2;
    }
  }
}

// block_q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}: per half (128 elements),
// element 32k + l (k < 4, l < 32) is the nibble k/2 of ql[32(k%2) + l] with 2 high bits at
// bits 2k of qh[l], minus 32; group of 16 scales. x = (d * sc) * q
void deq_q6_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = half_at(src + 208);
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int g = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * static_cast<float>(sc[g]) * static_cast<float>(q1);
        dst[l + 32] = d * static_cast<float>(sc[g + 2]) * static_cast<float>(q2);
        dst[l + 64] = d * static_cast<float>(sc[g + 4]) * static_cast<float>(q3);
        dst[l + 96] = d * static_cast<float>(sc[g + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// block_q8_K {float d; int8 qs[256]; int16 bsums[16]}: x = d * q
void deq_q8_k(const uint8_t* src, float* dst, uint64_t nb) {
  for (uint64_t i = 0; i < nb; ++i, src += 292, dst += QK_K) {
    float d;
    std::memcpy(&d, src, 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 4);
    for (int j = 0; j < QK_K; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

struct TypeTraits {
  GgmlType type;
  const char* name;
  uint32_t block_elements;
  uint32_t block_bytes;
  BlockFn dequantize;  // nullptr: known but not supported
};

// Block sizes per ggml's ggml-common.h (sizeof(block_*)) and gguf-py's GGML_QUANT_SIZES.
constexpr TypeTraits kTypes[] = {
    {GgmlType::F32, "F32", 1, 4, deq_f32},
    {GgmlType::F16, "F16", 1, 2, deq_f16},
    {GgmlType::Q4_0, "Q4_0", 32, 18, deq_q4_0},
    {GgmlType::Q4_1, "Q4_1", 32, 20, deq_q4_1},
    {GgmlType::Q5_0, "Q5_0", 32, 22, deq_q5_0},
    {GgmlType::Q5_1, "Q5_1", 32, 24, deq_q5_1},
    {GgmlType::Q8_0, "Q8_0", 32, 34, deq_q8_0},
    {GgmlType::Q8_1, "Q8_1", 32, 36, nullptr},
    {GgmlType::Q2_K, "Q2_K", 256, 84, deq_q2_k},
    {GgmlType::Q3_K, "Q3_K", 256, 110, deq_q3_k},
    {GgmlType::Q4_K, "Q4_K", 256, 144, deq_q4_k},
    {GgmlType::Q5_K, "Q5_K", 256, 176, deq_q5_k},
    {GgmlType::Q6_K, "Q6_K", 256, 210, deq_q6_k},
    {GgmlType::Q8_K, "Q8_K", 256, 292, deq_q8_k},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, nullptr},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, nullptr},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, nullptr},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50, nullptr},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, nullptr},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110, nullptr},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, nullptr},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, nullptr},
    {GgmlType::I8, "I8", 1, 1, nullptr},
    {GgmlType::I16, "I16", 1, 2, nullptr},
    {GgmlType::I32, "I32", 1, 4, nullptr},
    {GgmlType::I64, "I64", 1, 8, nullptr},
    {GgmlType::F64, "F64", 1, 8, nullptr},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56, nullptr},
    {GgmlType::BF16, "BF16", 1, 2, deq_bf16},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54, nullptr},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, nullptr},
    {GgmlType::MXFP4, "MXFP4", 32, 17, nullptr},
    {GgmlType::NVFP4, "NVFP4", 64, 36, nullptr},
    {GgmlType::Q1_0, "Q1_0", 128, 18, nullptr},
};

// Threading: a parallel region costs a few microseconds when the cores are idle but can cost
// milliseconds when one is busy (on the 2-core dev box under a parallel build, dequantizing
// SmolLM2-135M took 2.6 s with per-tensor regions over every 331K-element Q4_1 tensor vs 0.2 s
// on one thread). At ~1 ns per element single-threaded (Q4_1, AVX2), tensors under 1M elements
// (1 ms of work) stay on the calling thread; larger ones split into 64K-element chunks.
constexpr uint64_t kParallelMinElements = uint64_t{1} << 20;
constexpr uint64_t kChunkElements = uint64_t{1} << 16;

const TypeTraits* traits(GgmlType type) {
  for (const TypeTraits& t : kTypes)
    if (t.type == type) return &t;
  return nullptr;
}

const TypeTraits& known_traits(GgmlType type) {
  const TypeTraits* t = traits(type);
  if (t == nullptr) fail("unknown tensor type {}", static_cast<uint32_t>(type));
  return *t;
}

}  // namespace

std::string type_name(GgmlType type) {
  const TypeTraits* t = traits(type);
  return t != nullptr ? std::string(t->name) : "type#" + std::to_string(static_cast<uint32_t>(type));
}

bool is_known(GgmlType type) { return traits(type) != nullptr; }

bool is_supported(GgmlType type) {
  const TypeTraits* t = traits(type);
  return t != nullptr && t->dequantize != nullptr;
}

uint64_t block_elements(GgmlType type) { return known_traits(type).block_elements; }
uint64_t block_bytes(GgmlType type) { return known_traits(type).block_bytes; }

void dequantize(GgmlType type, const uint8_t* src, float* dst, uint64_t n) {
  const TypeTraits* t = traits(type);
  if (t == nullptr || t->dequantize == nullptr) fail("tensor type {} is not supported", type_name(type));
  if (n % t->block_elements != 0)
    fail("cannot dequantize {} {} elements: not a multiple of the block size {}", n, t->name,
         t->block_elements);
  const uint64_t nblocks = n / t->block_elements;
  const BlockFn fn = t->dequantize;
  const uint64_t be = t->block_elements, bb = t->block_bytes;
  if (n < kParallelMinElements) {
    fn(src, dst, nblocks);
    return;
  }
  const uint64_t per_chunk = std::max<uint64_t>(1, kChunkElements / be);
  const int64_t nchunks = static_cast<int64_t>((nblocks + per_chunk - 1) / per_chunk);
  // Dynamic: a thread the OS runs late (a busy machine) takes fewer chunks instead of holding up
  // the rest with a fixed share.
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < nchunks; ++c) {
    const uint64_t b0 = static_cast<uint64_t>(c) * per_chunk;
    const uint64_t nb = std::min(per_chunk, nblocks - b0);
    fn(src + b0 * bb, dst + b0 * be, nb);
  }
}

}  // namespace fdpp::gguf
