// The KV cache's block accounting, backend-neutral: a fixed pool of blocks of `block_size` tokens
// each, handed to sequences as they grow. Callers ask before a step whether a sequence fits
// (can_grow / grow), so running out of cache is an admission decision, never an error in the
// middle of a forward pass. The backends own the memory the block ids index (the CUDA engine's
// paged cache; the CPU engine only uses the accounting).
#pragma once

#include <cstdint>
#include <vector>

namespace fdpp {

class KvBlockAllocator {
 public:
  KvBlockAllocator() = default;
  KvBlockAllocator(int64_t num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t capacity_tokens() const { return num_blocks_ * block_size_; }

  // Blocks a sequence of `tokens` tokens occupies.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Whether `blocks` (a sequence's list) can grow to hold new_length tokens.
  bool can_grow(const std::vector<int32_t>& blocks, int64_t new_length) const;
  // Appends blocks so that `blocks` holds new_length tokens; false, with nothing taken, when too few
  // are free.
  bool grow(std::vector<int32_t>& blocks, int64_t new_length);
  // Returns the blocks beyond what new_length tokens need (all of them for 0) to the pool.
  void shrink(std::vector<int32_t>& blocks, int64_t new_length);

 private:
  int64_t num_blocks_ = 0;
  int block_size_ = 16;
  std::vector<int32_t> free_;  // a stack; low ids are handed out first
};

}  // namespace fdpp
