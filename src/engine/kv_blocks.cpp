#include "engine/kv_blocks.h"

#include <numeric>

#include "fdpp/error.h"

namespace fdpp {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  check(block_size >= 1 && (block_size & (block_size - 1)) == 0, "KV block size {} must be a power of two", block_size);
  check(num_blocks >= 0 && num_blocks <= INT32_MAX, "KV block count {} out of range", num_blocks);
  free_.resize(static_cast<size_t>(num_blocks));
  // pop_back takes the last element: hand out low block ids first.
  std::iota(free_.rbegin(), free_.rend(), 0);
}

bool KvBlockAllocator::can_grow(const std::vector<int32_t>& blocks, int64_t new_length) const {
  const int64_t need = blocks_for(new_length) - static_cast<int64_t>(blocks.size());
  return need <= free_blocks();
}

bool KvBlockAllocator::grow(std::vector<int32_t>& blocks, int64_t new_length) {
  if (!can_grow(blocks, new_length)) return false;
  while (static_cast<int64_t>(blocks.size()) < blocks_for(new_length)) {
    blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlockAllocator::shrink(std::vector<int32_t>& blocks, int64_t new_length) {
  const size_t keep = static_cast<size_t>(blocks_for(new_length));
  while (blocks.size() > keep) {
    free_.push_back(blocks.back());
    blocks.pop_back();
  }
}

}  // namespace fdpp
