#include "backend/cpu/quant_repack.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/quant_matmul.h"
#include "backend/cpu/thread_pool.h"
#include "fdpp/error.h"

namespace fdpp::cpu {

using gguf::GgmlType;

namespace {

// Element e (0..255) of a Q4_K block's nibbles, and its setter (ggml layout: 64 elements per 32
// bytes, the low nibbles first).
inline int q4k_get(const uint8_t* qs, int e) { return (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 15; }
inline void q4k_set(uint8_t* qs, int e, int v) {
  uint8_t& b = qs[32 * (e / 64) + e % 32];
  const int sh = 4 * ((e / 32) % 2);
  b = static_cast<uint8_t>((b & ~(15 << sh)) | (v << sh));
}
// Q6_K element e as its unsigned 6 bits (ql at 0, qh at 128), and the setter.
inline int q6k_get(const uint8_t* wb, int e) {
  const int h = e / 128, kk = (e % 128) / 32, l = e % 32;
  const uint8_t qlb = wb[64 * h + l + 32 * (kk % 2)];
  const int low = kk < 2 ? (qlb & 15) : (qlb >> 4);
  return low | (((wb[128 + 32 * h + l] >> (2 * kk)) & 3) << 4);
}
inline void q6k_set(uint8_t* wb, int e, int v) {
  const int h = e / 128, kk = (e % 128) / 32, l = e % 32;
  uint8_t& qlb = wb[64 * h + l + 32 * (kk % 2)];
  const int sh = kk < 2 ? 0 : 4;
  qlb = static_cast<uint8_t>((qlb & ~(15 << sh)) | ((v & 15) << sh));
  uint8_t& qhb = wb[128 + 32 * h + l];
  qhb = static_cast<uint8_t>((qhb & ~(3 << (2 * kk))) | (((v >> 4) & 3) << (2 * kk)));
}

// One block of R rows: Pack = true copies rows -> group, false group row r -> row.
template <bool Pack>
void block_xfer(GgmlType type, int R, uint8_t* g, uint8_t* row, int r) {
  auto mv = [](uint8_t* gp, uint8_t* rp, size_t n) {
    if (Pack) std::memcpy(gp, rp, n);
    else std::memcpy(rp, gp, n);
  };
  // Q4_K and Q5_K open alike: d, dmin (2 bytes each) and 12 bytes of scales, as 3 words.
  auto k_header = [&] {
    mv(g + 2 * r, row, 2);
    mv(g + 2 * R + 2 * r, row + 2, 2);
    for (int w = 0; w < 3; ++w) mv(g + 4 * R + (w * R + r) * 4, row + 4 + 4 * w, 4);
  };
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q8_0: {
      const int words = type == GgmlType::Q4_0 ? 4 : 8;
      mv(g + 2 * r, row, 2);
      for (int p = 0; p < words; ++p) mv(g + 2 * R + (p * R + r) * 4, row + 2 + 4 * p, 4);
      break;
    }
    case GgmlType::Q4_1: {
      mv(g + 2 * r, row, 2);
      mv(g + 2 * R + 2 * r, row + 2, 2);
      for (int p = 0; p < 4; ++p) mv(g + 4 * R + (p * R + r) * 4, row + 4 + 4 * p, 4);
      break;
    }
    case GgmlType::Q4_K: {
      k_header();
      uint8_t* q = g + 16 * R;
      uint8_t* rq = row + 16;
      if (Pack) {  // the common direction, at load: the 256 nibbles first, then their new order
        uint8_t v[256];
        for (int c = 0; c < 4; ++c)
          for (int l = 0; l < 32; ++l) {
            v[64 * c + l] = rq[32 * c + l] & 15;
            v[64 * c + 32 + l] = rq[32 * c + l] >> 4;
          }
        for (int j = 0; j < 8; ++j)
          for (int p = 0; p < 4; ++p)
            for (int i = 0; i < 4; ++i)
              q[((j * 4 + p) * R + r) * 4 + i] = static_cast<uint8_t>(v[32 * j + 4 * p + i] | (v[32 * j + 16 + 4 * p + i] << 4));
        break;
      }
      for (int j = 0; j < 8; ++j)  // unpacking (tests, the tied embedding's rows)
        for (int p = 0; p < 4; ++p)
          for (int i = 0; i < 4; ++i) {
            const uint8_t b = q[((j * 4 + p) * R + r) * 4 + i];
            const int e0 = 32 * j + 4 * p + i, e1 = e0 + 16;
            q4k_set(rq, e0, b & 15);
            q4k_set(rq, e1, b >> 4);
          }
      break;
    }
    case GgmlType::Q5_K: {
      k_header();
      uint8_t* q = g + 16 * R;
      uint8_t* qh = row + 16;
      uint8_t* ql = row + 48;
      if (!Pack) std::memset(qh, 0, 32);
      for (int j = 0; j < 8; ++j) {
        uint8_t* qj = q + 20 * R * j;
        for (int i = 0; i < 4; ++i) {
          uint8_t& bits = qj[16 * R + r * 4 + i];
          if (Pack) bits = 0;
          for (int p = 0; p < 4; ++p) {
            uint8_t& b = qj[(p * R + r) * 4 + i];
            const int e0 = 32 * j + 4 * p + i, e1 = e0 + 16;
            if (Pack) {
              b = static_cast<uint8_t>(q4k_get(ql, e0) | (q4k_get(ql, e1) << 4));
              bits = static_cast<uint8_t>(bits | (((qh[e0 % 32] >> j) & 1) << p) | (((qh[e1 % 32] >> j) & 1) << (4 + p)));
            } else {
              q4k_set(ql, e0, b & 15);
              q4k_set(ql, e1, b >> 4);
              qh[e0 % 32] = static_cast<uint8_t>(qh[e0 % 32] | (((bits >> p) & 1) << j));
              qh[e1 % 32] = static_cast<uint8_t>(qh[e1 % 32] | (((bits >> (4 + p)) & 1) << j));
            }
          }
        }
      }
      break;
    }
    case GgmlType::Q6_K: {
      mv(g + 2 * r, row + 208, 2);
      for (int s = 0; s < 16; ++s) mv(g + 2 * R + s * R + r, row + 192 + s, 1);
      // Per group j of 32: its 4 ql words then its 2 qh words, 24 R bytes, read in order.
      uint8_t* q = g + 18 * R;
      if (Pack) {
        uint8_t v[256];
        for (int e = 0; e < 256; ++e) v[e] = static_cast<uint8_t>(q6k_get(row, e));
        for (int j = 0; j < 8; ++j) {
          uint8_t* qj = q + 24 * R * j;
          for (int p = 0; p < 4; ++p)
            for (int i = 0; i < 4; ++i)
              qj[(p * R + r) * 4 + i] =
                  static_cast<uint8_t>((v[32 * j + 4 * p + i] & 15) | ((v[32 * j + 16 + 4 * p + i] & 15) << 4));
          for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 4; ++i) {
              int b = 0;
              for (int p = 0; p < 4; ++p) b |= (v[32 * j + 16 * h + 4 * p + i] >> 4) << (2 * p);
              qj[16 * R + (h * R + r) * 4 + i] = static_cast<uint8_t>(b);
            }
        }
        break;
      }
      for (int j = 0; j < 8; ++j)
        for (int p = 0; p < 4; ++p)
          for (int i = 0; i < 4; ++i) {
            uint8_t& b = q[24 * R * j + (p * R + r) * 4 + i];
            const int e0 = 32 * j + 4 * p + i, e1 = e0 + 16;
            if (Pack) {
              b = static_cast<uint8_t>((q6k_get(row, e0) & 15) | ((q6k_get(row, e1) & 15) << 4));
            } else {
              // The high bits come below, from qh: set the low 4 now, keeping what is there.
              q6k_set(row, e0, (q6k_get(row, e0) & 0x30) | (b & 15));
              q6k_set(row, e1, (q6k_get(row, e1) & 0x30) | (b >> 4));
            }
          }
      for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h)
          for (int i = 0; i < 4; ++i) {
            uint8_t& b = q[24 * R * j + 16 * R + (h * R + r) * 4 + i];
            if (Pack) b = 0;
            for (int p = 0; p < 4; ++p) {
              const int e = 32 * j + 16 * h + 4 * p + i;
              if (Pack) {
                b = static_cast<uint8_t>(b | ((q6k_get(row, e) >> 4) << (2 * p)));
              } else {
                q6k_set(row, e, (q6k_get(row, e) & 15) | (((b >> (2 * p)) & 3) << 4));
              }
            }
          }
      break;
    }
    default:
      check(false, "no interleaved layout for {}", gguf::type_name(type));
  }
}

// munmap'ing deleter of an anonymous mapping.
struct Unmap {
  size_t bytes;
  void operator()(const void* p) const { ::munmap(const_cast<void*>(p), bytes); }
};

std::shared_ptr<const void> anon_buffer(size_t bytes, uint8_t** data) {
  void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(p != MAP_FAILED, "could not allocate {} bytes for repacked weights", bytes);
  // 2 MiB pages: a 7B decode streams ~4 GB per token, ~1M 4 KiB TLB entries otherwise.
#ifdef MADV_HUGEPAGE
  ::madvise(p, bytes, MADV_HUGEPAGE);
#endif
  *data = static_cast<uint8_t*>(p);
  return std::shared_ptr<const void>(p, Unmap{std::max<size_t>(bytes, 1)});
}

// Drops this process's pages of a read-only file mapping (they come back from the page cache if
// touched again); rounds outward, which is harmless for a clean file mapping.
void drop_mapped(const uint8_t* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

}  // namespace

bool repack_supported(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q4_1 || type == GgmlType::Q8_0 || type == GgmlType::Q4_K ||
         type == GgmlType::Q5_K || type == GgmlType::Q6_K;
}

void pack_group(GgmlType type, int R, const uint8_t* const* rows, int64_t cols, uint8_t* dst) {
  const int64_t be = static_cast<int64_t>(gguf::block_elements(type)), bb = static_cast<int64_t>(gguf::block_bytes(type));
  for (int64_t b = 0; b < cols / be; ++b)
    for (int r = 0; r < R; ++r)
      block_xfer<true>(type, R, dst + b * bb * R, const_cast<uint8_t*>(rows[r] + b * bb), r);
}

void unpack_group_row(GgmlType type, int R, const uint8_t* group, int r, int64_t cols, uint8_t* dst) {
  const int64_t be = static_cast<int64_t>(gguf::block_elements(type)), bb = static_cast<int64_t>(gguf::block_bytes(type));
  std::memset(dst, 0, static_cast<size_t>(cols / be * bb));
  for (int64_t b = 0; b < cols / be; ++b)
    block_xfer<false>(type, R, const_cast<uint8_t*>(group + b * bb * R), dst + b * bb, r);
}

StoredMatrix repack_matrix(const StoredMatrix& m, int R, bool drop_source) {
  if (R <= 0 || m.empty() || m.packed_rows > 0 || !repack_supported(m.type)) return m;
  const int64_t groups = m.rows / R, tail = m.rows % R;
  const uint64_t rb = m.row_bytes;
  uint8_t* data = nullptr;
  StoredMatrix p = m;
  p.packed = anon_buffer(rb * static_cast<uint64_t>(m.rows), &data);
  p.data = data;
  p.packed_rows = R;
  p.row_order = nullptr;
  const uint64_t group_bytes = rb * static_cast<uint64_t>(R);
  // Chunks of ~1 MiB, each source range dropped once copied: the peak holds one chunk twice, not
  // the matrix (a 30 MB tied embedding of the default model otherwise raised peak RSS by 30 MB).
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((1u << 20) / group_bytes));
  for (int64_t c0 = 0; c0 < groups; c0 += chunk) {
    const int64_t c1 = std::min(groups, c0 + chunk);
    const int64_t tasks = task_count(c1 - c0, 8);
    const int64_t per = (c1 - c0 + tasks - 1) / tasks;
    parallel_for(tasks, [&](int64_t t) {
      std::vector<const uint8_t*> rows(static_cast<size_t>(R));
      for (int64_t g = c0 + t * per; g < std::min(c1, c0 + (t + 1) * per); ++g) {
        for (int r = 0; r < R; ++r) rows[static_cast<size_t>(r)] = m.row(g * R + r);
        pack_group(m.type, R, rows.data(), m.cols, data + static_cast<uint64_t>(g) * group_bytes);
      }
    });
    if (drop_source) {
      // The rows' span in the source (row_order permutes rows within a head: a small span).
      const uint8_t* lo = m.row(c0 * R);
      const uint8_t* hi = lo;
      for (int64_t n = c0 * R; n < c1 * R; ++n) lo = std::min(lo, m.row(n)), hi = std::max(hi, m.row(n));
      drop_mapped(lo, static_cast<size_t>(hi - lo) + rb);
    }
  }
  for (int64_t r = 0; r < tail; ++r)
    std::memcpy(data + static_cast<uint64_t>(groups) * group_bytes + static_cast<uint64_t>(r) * rb,
                m.row(groups * R + r), rb);
  if (drop_source) drop_mapped(m.data, rb * static_cast<uint64_t>(m.rows));
  return p;
}

void stored_row_bytes(const StoredMatrix& m, int64_t n, uint8_t* out) {
  check(n >= 0 && n < m.rows, "row {} is out of range [0, {})", n, m.rows);
  if (m.packed_rows == 0) {
    std::memcpy(out, m.row(n), m.row_bytes);
    return;
  }
  const int R = m.packed_rows;
  const int64_t groups = m.rows / R;
  const uint64_t group_bytes = m.row_bytes * static_cast<uint64_t>(R);
  if (n >= groups * R) {
    std::memcpy(out, m.data + static_cast<uint64_t>(groups) * group_bytes + static_cast<uint64_t>(n - groups * R) * m.row_bytes,
                m.row_bytes);
    return;
  }
  unpack_group_row(m.type, R, m.data + static_cast<uint64_t>(n / R) * group_bytes, static_cast<int>(n % R), m.cols, out);
}

void repack_weights(DecoderWeights& w, bool mapped) {
  const int R = pack_rows(best_isa());
  if (R <= 0) return;
  std::vector<std::pair<const uint8_t*, size_t>> sources;
  auto one = [&](Weight& x) {
    StoredMatrix& m = x.stored;
    if (m.empty() || !repack_supported(m.type) || m.packed_rows > 0) return;
    // A stack of experts is packed as one matrix only where each expert starts a group, so that
    // an expert's rows stay a view of whole groups.
    if (m.matrices > 1 && (m.rows / m.matrices) % R != 0) return;
    sources.emplace_back(m.data, m.row_bytes * static_cast<uint64_t>(m.rows));
    m = repack_matrix(m, R, mapped);
  };
  for (LayerWeights& l : w.layers) {
    for (Weight* x : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.experts_gate, &l.experts_up,
                      &l.experts_down})
      one(*x);
  }
  // The output matrix: the embeddings themselves when tied (embedding_row unpacks its rows); an
  // untied embedding table stays mapped, read a row per token.
  one(w.lm_head.present() ? w.lm_head : w.tok_embeddings);
  // Reading the next matrix faults its neighbours back in (the kernel maps up to 64 KiB around a
  // fault): drop every source once more (5 MB of the default model's 96 MB were back otherwise).
  if (mapped)
    for (const auto& [p, n] : sources) drop_mapped(p, n);
}

}  // namespace fdpp::cpu
