// Where a key's row of one kv head sits in the paged KV cache on the GPU: one description shared by
// the cache writers (rope_kv.cu), prefill and decode attention, so that they cannot disagree.
//
// A layer's K (and V) cache is num_blocks blocks of block_size keys x n_kv_heads rows of head_dim
// 16-bit elements, in one of two orders within a block (KernelOptions::kv_head_major):
//   head-major  [block][kv head][key][D] (the default): a kv head's block_size rows are adjacent;
//   token-major [block][key][kv head][D]: a token's kv heads are adjacent.
// Decode attention reads one kv head's rows per CTA. At head_dim 64 a row is 128 bytes, and
// token-major scatters them n_kv_heads x 128 bytes apart: MHA 32/32 with 16-token blocks in random
// order ran 5-6% slower token-major at batch 8-64 with 16K-64K keys (H200, fp16: batch 32, 64K keys
// 4063.6 against 3815.6 us; cuDNN's dense kernel 3787.1), GQA 32/8 at 64 1-5% slower at batch 8 and
// 64 and within run-to-run noise (2.5% there) at batch 32 (docs/results/2026-12-02b-flashinfer-grid.md).
// At head_dim 128 the two measured within 0.5% at every point of the decode grid
// (docs/results/2026-12-01x-check-layout-large.md). Token-major stays as a measurement switch
// (bench-attention --kv-layout token-major).
#pragma once

#include <cstdint>

#include "backend/cuda/kernel_options.h"
#include "fdpp/error.h"

namespace fdpp::cuda {

struct KvCacheLayout {
  int block_shift;       // log2(block_size)
  int64_t block_stride;  // elements between blocks: block_size * n_kv_heads * head_dim
  int64_t token_stride;  // between a kv head's consecutive keys in a block
  int64_t head_stride;   // between kv heads at the same key

  // The first element of the row of `kv_head` at `key` of `block`.
#if defined(__CUDACC__)
  __host__ __device__
#endif
      int64_t
      row(int64_t block, int key_in_block, int kv_head) const {
    return block * block_stride + int64_t(key_in_block) * token_stride + int64_t(kv_head) * head_stride;
  }
  // The same for a cache slot (block * block_size + key in block), as the engine numbers them.
#if defined(__CUDACC__)
  __host__ __device__
#endif
      int64_t
      slot_row(int64_t slot, int kv_head) const {
    return row(slot >> block_shift, static_cast<int>(slot & ((int64_t(1) << block_shift) - 1)), kv_head);
  }
};

// Every launcher that reads or writes the cache builds its layout here, so the block size is checked
// once: a power of two (slots split into block and key by a shift and a mask) of at most 2^20 keys.
// `what` names the caller in the error.
inline KvCacheLayout kv_cache_layout(int block_size, int n_kv_heads, int head_dim, bool head_major,
                                     const char* what = "kv_cache_layout") {
  check(block_size > 0 && (block_size & (block_size - 1)) == 0 && block_size <= (1 << 20),
        "{}: block_size = {} must be a power of two of at most 2^20", what, block_size);
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  KvCacheLayout l;
  l.block_shift = shift;
  l.block_stride = int64_t(block_size) * n_kv_heads * head_dim;
  l.token_stride = head_major ? head_dim : int64_t(n_kv_heads) * head_dim;
  l.head_stride = head_major ? int64_t(block_size) * head_dim : head_dim;
  return l;
}

// The layout the calling thread's KernelOptions choose.
inline KvCacheLayout kv_cache_layout(int block_size, int n_kv_heads, int head_dim,
                                     const char* what = "kv_cache_layout") {
  return kv_cache_layout(block_size, n_kv_heads, head_dim, current_kernel_options().kv_head_major, what);
}

}  // namespace fdpp::cuda
