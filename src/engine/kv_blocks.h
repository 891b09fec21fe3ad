// The KV cache's block accounting, backend-neutral: a fixed pool of blocks of `block_size` tokens
// each, handed to sequences as they grow. Callers ask before a step whether a sequence fits
// (can_grow / grow), so running out of cache is an admission decision, never an error in the
// middle of a forward pass. The backends own the memory the block ids index (the CUDA engine's
// paged cache, the CPU engine's block pool).
//
// Prefix caching (vLLM's automatic prefix caching; SGLang's radix tree is the same idea on a tree)
// lives here too, so the CPU and CUDA engines share it. Blocks are reference-counted: a block is
// held by every sequence that maps it. A full block can be registered under a chained hash of
// (its parent's hash, its token ids, the engine's salt); a later sequence with the same beginning
// maps the registered blocks instead of computing them. A registered block whose last holder lets
// go stays cached; it is evicted only when a sequence needs a fresh block and no never-used one is
// left, least recently released first and only leaves (no cached child), so a chain is cut from its
// end. A block in use is never evicted. Shared blocks are full, so nobody writes into them: a
// sequence only writes past its mapped prefix.
//
// Sliding windows (Engine, when every layer slides): a sequence gives back the blocks that lie wholly
// before its window (release_leading) and keeps kFreed in their places, so that its list still maps
// position p to entry p / block_size. A cached block let go that way can be idle while a
// descendant is still held (an idle interior block). It still counts as free: when no idle leaf is
// left, the least recently released idle interior block is evicted with its whole subtree cut from
// the cache (its held descendants stay with their holders, uncached; its idle ones are freed), so
// no lookup can reach a block whose ancestors are gone.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

namespace fdpp {

// The hash of a full block: chained over the parent's hash so that equal token ids at different
// places of different prefixes differ. `salt` stands for what else changes the keys and values
// (the model, the cache's dtype); 0 for the first block's parent.
uint64_t prefix_block_hash(uint64_t parent_hash, uint64_t salt, std::span<const int32_t> tokens);

class KvBlockAllocator {
 public:
  // A sequence's list entry for a block it gave back (release_leading): those positions are never
  // read again.
  static constexpr int32_t kFreed = -1;

  KvBlockAllocator() = default;
  KvBlockAllocator(int64_t num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Blocks a sequence can take: never used or released, cached ones included (they are evicted on
  // demand).
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()) + idle_cached_; }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }  // held by a sequence
  int64_t capacity_tokens() const { return num_blocks_ * block_size_; }
  int64_t cached_blocks() const { return static_cast<int64_t>(table_.size()); }  // registered, held or not
  uint64_t evictions() const { return evictions_; }

  // Blocks a sequence of `tokens` tokens occupies.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Whether `blocks` (a sequence's list) can grow to hold new_length tokens.
  bool can_grow(const std::vector<int32_t>& blocks, int64_t new_length) const;
  // Appends fresh blocks (never-used first, then evicted cached ones) so that `blocks` holds
  // new_length tokens; false, with nothing taken, when too few are free.
  bool grow(std::vector<int32_t>& blocks, int64_t new_length);
  // Lets go of the blocks beyond what new_length tokens need (all of them for 0).
  void shrink(std::vector<int32_t>& blocks, int64_t new_length);
  // Lets go of blocks[0, count) and marks them kFreed (those already kFreed are skipped); `blocks`
  // keeps its size. Returns how many were let go.
  int64_t release_leading(std::vector<int32_t>& blocks, int64_t count);
  // Entries of a list that are blocks (not kFreed).
  static int64_t held(const std::vector<int32_t>& blocks);

  // The registered block for `hash` whose parent is `parent` (-1: the first block) and whose tokens
  // are `tokens` (checked, so a hash collision is a miss, never a wrong hit); -1 when none.
  int32_t lookup(uint64_t hash, int32_t parent, std::span<const int32_t> tokens) const;
  // Whether a looked-up block is held by no sequence (mapping it takes one from free_blocks()).
  bool unreferenced(int32_t block) const { return refs_[block] == 0; }
  // Maps a looked-up block into a sequence's list (one more holder).
  void acquire(int32_t block, std::vector<int32_t>& blocks);
  // Registers a full block held by a sequence under `hash`, a child of `parent` (-1 for the first
  // block; else a registered block held by the same sequence, so that a chain's ancestors stay held
  // as long as its holders keep their whole lists; see above for lists with kFreed). False when the hash is
  // registered already (to another block, or this one): the block stays private and returns to the
  // pool when let go.
  bool register_block(int32_t block, uint64_t hash, int32_t parent, std::span<const int32_t> tokens);
  // The registered block of `hash` regardless of parent and tokens, or -1.
  int32_t registered(uint64_t hash) const;

  // For tests: the holders of a block, and whether it is registered.
  int32_t ref_count(int32_t block) const { return refs_[block]; }
  bool is_registered(int32_t block) const { return hash_of_[block].has; }
  // Checks the internal invariants (every block exactly once among free / evictable / held, the
  // evictable set is the unreferenced registered leaves, the interior set the unreferenced registered
  // blocks with children, child lists match the parents); throws fdpp::Error.
  // `holders[b]`, when given, is how many sequences map block b.
  void check_invariants(std::span<const int32_t> holders = {}) const;

 private:
  struct Registration {
    bool has = false;
    uint64_t hash = 0;
    int32_t parent = -1;
    std::vector<int32_t> children;  // registered blocks whose parent this is
  };
  void release(int32_t block);
  void make_idle(int32_t block);    // into evictable_ (a leaf) or interior_
  void forget_idle(int32_t block);  // out of whichever of them holds it
  int32_t take_block();  // a fresh block, ref 1; free_blocks() > 0
  void evict(int32_t block);
  void cut_subtree(int32_t block);  // unregisters block's descendants (idle ones to free_)

  int64_t num_blocks_ = 0;
  int block_size_ = 16;
  std::vector<int32_t> free_;  // never used (or unregistered and released): a stack, low ids first
  std::vector<int32_t> refs_;
  std::vector<Registration> hash_of_;
  std::vector<int32_t> tokens_;  // [num_blocks, block_size]: a registered block's token ids
  std::vector<uint64_t> released_at_;  // the tick its last holder let go (LRU order)
  std::unordered_map<uint64_t, int32_t> table_;
  std::set<std::pair<uint64_t, int32_t>> evictable_;  // (released_at, block): unreferenced registered leaves
  std::set<std::pair<uint64_t, int32_t>> interior_;   // (released_at, block): unreferenced, with children
  int64_t idle_cached_ = 0;  // registered blocks no sequence holds
  uint64_t tick_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace fdpp
