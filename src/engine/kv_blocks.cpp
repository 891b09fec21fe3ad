#include "engine/kv_blocks.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <string_view>

#include "fdpp/error.h"

namespace fdpp {

uint64_t prefix_block_hash(uint64_t parent_hash, uint64_t salt, std::span<const int32_t> tokens) {
  // std::hash over the bytes: a lookup also compares the tokens and the parent block, so the hash
  // only has to spread well, not resist collisions.
  std::vector<char> bytes(2 * sizeof(uint64_t) + tokens.size_bytes());
  std::memcpy(bytes.data(), &parent_hash, sizeof(uint64_t));
  std::memcpy(bytes.data() + sizeof(uint64_t), &salt, sizeof(uint64_t));
  if (!tokens.empty()) std::memcpy(bytes.data() + 2 * sizeof(uint64_t), tokens.data(), tokens.size_bytes());
  return std::hash<std::string_view>{}(std::string_view(bytes.data(), bytes.size()));
}

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  check(block_size >= 1 && (block_size & (block_size - 1)) == 0, "KV block size {} must be a power of two", block_size);
  check(num_blocks >= 0 && num_blocks <= INT32_MAX, "KV block count {} out of range", num_blocks);
  free_.resize(static_cast<size_t>(num_blocks));
  // pop_back takes the last element: hand out low block ids first.
  std::iota(free_.rbegin(), free_.rend(), 0);
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  hash_of_.assign(static_cast<size_t>(num_blocks), Registration{});
  released_at_.assign(static_cast<size_t>(num_blocks), 0);
}

bool KvBlockAllocator::can_grow(const std::vector<int32_t>& blocks, int64_t new_length) const {
  const int64_t need = blocks_for(new_length) - static_cast<int64_t>(blocks.size());
  return need <= free_blocks();
}

int32_t KvBlockAllocator::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    b = evictable_.begin()->second;
    evict(b);
  } else {
    // Only idle blocks whose descendants are held (a windowed sequence let go of its first blocks):
    // the oldest goes, and what hangs below it can no longer be looked up.
    check(!interior_.empty(), "internal: no KV block to evict ({} idle cached)", idle_cached_);
    b = interior_.begin()->second;
    cut_subtree(b);
    evict(b);
  }
  refs_[b] = 1;
  return b;
}

void KvBlockAllocator::evict(int32_t b) {
  Registration& r = hash_of_[b];
  evictable_.erase({released_at_[b], b});
  table_.erase(r.hash);
  if (r.parent >= 0) {
    Registration& p = hash_of_[r.parent];
    const bool was_idle_interior = refs_[r.parent] == 0;
    if (was_idle_interior) forget_idle(r.parent);
    std::erase(p.children, b);
    if (was_idle_interior) make_idle(r.parent);
  }
  r = Registration{};
  --idle_cached_;
  ++evictions_;
}

void KvBlockAllocator::cut_subtree(int32_t b) {
  std::vector<int32_t> stack = std::move(hash_of_[b].children);
  hash_of_[b].children.clear();
  if (refs_[b] == 0) {  // now a leaf
    forget_idle(b);
    make_idle(b);
  }
  while (!stack.empty()) {
    const int32_t d = stack.back();
    stack.pop_back();
    Registration& r = hash_of_[d];
    stack.insert(stack.end(), r.children.begin(), r.children.end());
    table_.erase(r.hash);
    if (refs_[d] == 0) {
      forget_idle(d);
      --idle_cached_;
      ++evictions_;
      free_.push_back(d);
    }
    r = Registration{};  // a held one stays with its holders, uncached
  }
}

void KvBlockAllocator::make_idle(int32_t b) {
  (hash_of_[b].children.empty() ? evictable_ : interior_).insert({released_at_[b], b});
}

void KvBlockAllocator::forget_idle(int32_t b) {
  evictable_.erase({released_at_[b], b});
  interior_.erase({released_at_[b], b});
}

bool KvBlockAllocator::grow(std::vector<int32_t>& blocks, int64_t new_length) {
  if (!can_grow(blocks, new_length)) return false;
  while (static_cast<int64_t>(blocks.size()) < blocks_for(new_length)) blocks.push_back(take_block());
  return true;
}

void KvBlockAllocator::release(int32_t b) {
  check(refs_[b] > 0, "internal: KV block {} released more often than held", b);
  if (--refs_[b] > 0) return;
  if (!hash_of_[b].has) {
    free_.push_back(b);
    return;
  }
  ++idle_cached_;
  released_at_[b] = ++tick_;
  make_idle(b);
}

void KvBlockAllocator::shrink(std::vector<int32_t>& blocks, int64_t new_length) {
  const size_t keep = static_cast<size_t>(blocks_for(new_length));
  while (blocks.size() > keep) {
    if (blocks.back() != kFreed) release(blocks.back());
    blocks.pop_back();
  }
}

int64_t KvBlockAllocator::release_leading(std::vector<int32_t>& blocks, int64_t count) {
  // The entries already given back are a prefix of the list: walk back from count to it, so that
  // a step's call costs the blocks it frees, not the sequence's length.
  int64_t n = 0;
  for (size_t i = std::min(blocks.size(), static_cast<size_t>(std::max<int64_t>(0, count))); i-- > 0;) {
    if (blocks[i] == kFreed) break;
    release(blocks[i]);
    blocks[i] = kFreed;
    ++n;
  }
  return n;
}

int64_t KvBlockAllocator::held(const std::vector<int32_t>& blocks) {
  return static_cast<int64_t>(std::count_if(blocks.begin(), blocks.end(), [](int32_t b) { return b != kFreed; }));
}

int32_t KvBlockAllocator::registered(uint64_t hash) const {
  const auto it = table_.find(hash);
  return it == table_.end() ? -1 : it->second;
}

int32_t KvBlockAllocator::lookup(uint64_t hash, int32_t parent, std::span<const int32_t> tokens) const {
  const int32_t b = registered(hash);
  if (b < 0 || hash_of_[b].parent != parent || static_cast<int64_t>(tokens.size()) != block_size_) return -1;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * block_size_;
  return std::equal(tokens.begin(), tokens.end(), stored) ? b : -1;
}

void KvBlockAllocator::acquire(int32_t b, std::vector<int32_t>& blocks) {
  check(b >= 0 && b < num_blocks_ && hash_of_[b].has, "internal: KV block {} is not a cached block", b);
  if (refs_[b] == 0) {
    --idle_cached_;
    forget_idle(b);
  }
  ++refs_[b];
  blocks.push_back(b);
}

bool KvBlockAllocator::register_block(int32_t b, uint64_t hash, int32_t parent, std::span<const int32_t> tokens) {
  check(b >= 0 && b < num_blocks_ && refs_[b] > 0, "internal: registering KV block {} that no sequence holds", b);
  check(static_cast<int64_t>(tokens.size()) == block_size_, "internal: registering a block of {} tokens", tokens.size());
  check(parent < 0 || (hash_of_[parent].has && refs_[parent] > 0),
        "internal: KV block {}'s parent {} is not a held cached block", b, parent);
  if (hash_of_[b].has || table_.count(hash) != 0) return false;
  if (tokens_.empty()) tokens_.resize(static_cast<size_t>(num_blocks_) * block_size_);
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<size_t>(b) * block_size_);
  hash_of_[b] = Registration{true, hash, parent, {}};
  table_.emplace(hash, b);
  if (parent >= 0) hash_of_[parent].children.push_back(b);
  return true;
}

void KvBlockAllocator::check_invariants(std::span<const int32_t> holders) const {
  const size_t n = static_cast<size_t>(num_blocks_);
  std::vector<int> in_free(n, 0);
  for (int32_t b : free_) {
    check(b >= 0 && b < num_blocks_, "invariant: free list holds block {}", b);
    check(++in_free[b] == 1, "invariant: block {} is on the free list twice", b);
    check(refs_[b] == 0, "invariant: free block {} is held {} times", b, refs_[b]);
    check(!hash_of_[b].has, "invariant: free block {} is still registered", b);
  }
  std::vector<int32_t> children(n, 0);
  int64_t idle = 0, registered_count = 0;
  for (size_t b = 0; b < n; ++b) {
    check(refs_[b] >= 0, "invariant: block {} has {} holders", b, refs_[b]);
    if (!holders.empty()) check(refs_[b] == holders[b], "invariant: block {} counts {} holders, {} sequences map it", b, refs_[b], holders[b]);
    const Registration& r = hash_of_[b];
    if (!r.has) {
      // Neither free nor held nor cached would be a leak.
      check(refs_[b] > 0 || in_free[b] == 1, "invariant: block {} is leaked (not free, held or cached)", b);
      continue;
    }
    ++registered_count;
    const auto it = table_.find(r.hash);
    check(it != table_.end() && it->second == static_cast<int32_t>(b), "invariant: block {} is not in the table", b);
    if (r.parent >= 0) {
      check(hash_of_[r.parent].has, "invariant: block {}'s parent {} is not cached", b, r.parent);
      const std::vector<int32_t>& kids = hash_of_[r.parent].children;
      check(std::count(kids.begin(), kids.end(), static_cast<int32_t>(b)) == 1,
            "invariant: block {} is not listed once among its parent {}'s children", b, r.parent);
      ++children[r.parent];
    }
    if (refs_[b] == 0) ++idle;
  }
  check(registered_count == static_cast<int64_t>(table_.size()), "invariant: {} registered blocks, {} table entries",
        registered_count, table_.size());
  check(idle == idle_cached_, "invariant: {} idle cached blocks counted as {}", idle, idle_cached_);
  size_t leaves = 0, inner = 0;
  for (size_t b = 0; b < n; ++b) {
    const Registration& r = hash_of_[b];
    if (!r.has) {
      check(r.children.empty(), "invariant: uncached block {} lists children", b);
      continue;
    }
    check(children[b] == static_cast<int32_t>(r.children.size()), "invariant: block {} lists {} children, has {}", b,
          r.children.size(), children[b]);
    const std::pair<uint64_t, int32_t> key{released_at_[b], static_cast<int32_t>(b)};
    const bool leaf = refs_[b] == 0 && r.children.empty();
    const bool interior = refs_[b] == 0 && !r.children.empty();
    check(leaf == (evictable_.count(key) == 1), "invariant: block {} is {} the eviction set", b,
          leaf ? "missing from" : "wrongly in");
    check(interior == (interior_.count(key) == 1), "invariant: block {} is {} the interior set", b,
          interior ? "missing from" : "wrongly in");
    leaves += leaf ? 1 : 0;
    inner += interior ? 1 : 0;
  }
  check(leaves == evictable_.size(), "invariant: the eviction set has {} entries, {} leaves", evictable_.size(), leaves);
  check(inner == interior_.size(), "invariant: the interior set has {} entries, {} idle interior blocks",
        interior_.size(), inner);
}

}  // namespace fdpp
