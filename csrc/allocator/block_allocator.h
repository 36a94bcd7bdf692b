#pragma once
// The paged-block allocator with prefix caching. The semantics are stated once, in the Python
// docstring in bindings.cpp; this header documents only what the C++ side adds.
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "key_map.h"

namespace gnomon {

// A borrowed, read-only 1-D integer array: int32 or int64, as numpy hands it over; or, with
// `broadcast`, one value read as `size` equal entries (a Python int given for a whole batch).
struct IntSpan {
  const void* data = nullptr;
  size_t size = 0;
  bool is_int64 = false;
  bool broadcast = false;

  int64_t operator[](size_t i) const {
    const size_t at = broadcast ? 0 : i;
    return is_int64 ? static_cast<const int64_t*>(data)[at]
                    : static_cast<const int32_t*>(data)[at];
  }
};

// Borrowed token ids, already checked to be int32.
struct TokenSpan {
  const int32_t* data = nullptr;
  size_t size = 0;
};

// What changed in one group's block table of a sequence since its previous report
// (take_block_updates). `appended` points into the table and stays valid until the allocator next
// changes.
struct GroupUpdate {
  const int32_t* appended = nullptr;
  size_t num_appended = 0;
  std::vector<std::pair<int32_t, int32_t>> replaced;  // (index, new block id), index < reported
};

struct BlockUpdate {
  bool full = false;  // the first report of the sequence: `appended` is each whole table
  std::vector<GroupUpdate> groups;
};

struct AllocatorStats {
  int64_t queries = 0;  // prompt tokens offered to the prefix cache at admission
  int64_t hits = 0;     // of those, tokens whose KV was found cached
  int64_t allocations = 0;
  int64_t failed_allocations = 0;
  int64_t evictions = 0;
};

// One KV-cache group's counters: blocks its tables hold now, its cache entries, the cached
// blocks reused as fresh ones, and the blocks its window released.
struct GroupStats {
  int64_t blocks_in_use = 0;
  int64_t evictions = 0;
  int64_t released = 0;
};

class BlockAllocator {
 public:
  static constexpr int64_t kMaxBlocks = (int64_t{1} << 31) - 3;  // int32 ids plus two sentinels
  static constexpr int64_t kMaxBlockSize = int64_t{1} << 20;

  static constexpr int32_t kNullBlock = -1;  // a table entry whose block the window released
  static constexpr int64_t kFullAttention = 0;

  // `windows` has one entry per KV-cache group: kFullAttention, or a sliding window >= 1.
  BlockAllocator(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching, int hash_bits,
                 std::vector<int64_t> windows = {kFullAttention});

  int64_t lookup(TokenSpan tokens, uint64_t extra_key) const;
  bool allocate(int64_t seq_id, TokenSpan new_tokens, int64_t num_new_tokens, uint64_t extra_key);
  // lookup and allocate of a new sequence in one pass over its tokens: the new tokens are
  // min(target - cached, max_new_tokens); returns the cached tokens, or -1 when they do not fit.
  int64_t admit(int64_t seq_id, TokenSpan tokens, int64_t target, int64_t max_new_tokens,
                uint64_t extra_key);
  // admit again with the tokens and extra key of the last admit that returned -1, which must
  // have been of `seq_id`; the same answer as passing them.
  int64_t retry_admission(int64_t seq_id, int64_t target, int64_t max_new_tokens,
                          uint64_t extra_key);
  void commit(int64_t seq_id, int64_t num_computed_tokens);
  int64_t allocate_batch(IntSpan seq_ids, IntSpan new_token_ids, IntSpan new_token_counts,
                         IntSpan num_new_tokens);
  void commit_batch(IntSpan seq_ids, IntSpan num_computed_tokens);
  // A null `num_computed_tokens` commits each sequence up to the tokens it has slots for.
  int64_t step(IntSpan commit_seq_ids, const IntSpan* num_computed_tokens, IntSpan free_seq_ids,
               IntSpan seq_ids, IntSpan new_token_ids, IntSpan new_token_counts,
               IntSpan num_new_tokens);
  void free(int64_t seq_id);
  void fork(int64_t parent_seq_id, int64_t child_seq_id);
  std::vector<std::pair<int32_t, int32_t>> take_pending_copies();
  std::vector<BlockUpdate>& take_block_updates(IntSpan seq_ids);
  // take_block_updates of the first `fitted` sequences the last step() allocated, which it has
  // already resolved.
  std::vector<BlockUpdate>& take_step_updates(int64_t fitted);
  bool reset_prefix_cache();

  const std::vector<int32_t>& block_table(int64_t seq_id, int64_t group = 0) const;
  int64_t num_computed_tokens(int64_t seq_id) const;
  bool contains(int64_t seq_id) const { return seqs_.count(seq_id) != 0; }
  int32_t ref_count(int64_t block_id) const;
  std::vector<int32_t> free_queue() const;
  std::vector<int32_t> cached_blocks() const;

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  int hash_bits() const { return hash_bits_; }
  int64_t num_free_blocks() const { return num_free_; }
  int64_t num_cached_blocks() const;
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  double usage() const { return 1.0 - static_cast<double>(num_free_) / num_blocks(); }
  const AllocatorStats& stats() const { return stats_; }
  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  int64_t window(int64_t group) const { return groups_[group].window; }
  const GroupStats& group_stats(int64_t group) const { return groups_[group].stats; }
  int64_t num_group_cached_blocks(int64_t group) const {
    return static_cast<int64_t>(groups_[group].cache.size());
  }

  // The full-width chained key of one block; the allocator keeps its low hash_bits bits.
  static uint64_t hash_block(uint64_t parent_key, const int32_t* tokens, size_t count,
                             uint64_t extra_key);

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t group = 0;  // the group whose table holds it, or whose cache entry it is
    bool cached = false;
    uint64_t key = 0;
    uint64_t serial = 0;  // unique per cache entry, never reused
    // The anchor entry this block's KV is checked against: in the anchor group the parent entry
    // it was computed on top of; in any other group the anchor's entry for the same prefix.
    uint64_t verify_serial = 0;
    uint64_t extra_key = 0;
  };

  struct Group {
    int64_t window = kFullAttention;
    KeyMap cache;  // chain key -> block id
    GroupStats stats;
  };

  // One group's block table of a sequence.
  struct Table {
    std::vector<int32_t> blocks;
    int64_t num_released = 0;       // leading entries the window has released (kNullBlock)
    int64_t num_reported = 0;       // leading entries already reported
    std::vector<int32_t> replaced;  // reported entries replaced in place since then
  };

  struct Sequence {
    std::vector<int32_t> tokens;
    std::vector<Table> tables;  // one per group, all of the same length
    int64_t num_computed = 0;
    int64_t num_slots = 0;           // tokens the block tables were last sized for
    int64_t num_full_committed = 0;  // leading full blocks already offered to the cache
    uint64_t last_key = 0;           // chain key of the last of those blocks
    uint64_t last_serial = 0;        // anchor entry holding that block's prefix, or none
    uint64_t extra_key = 0;
    uint64_t batch_mark = 0;
    int64_t num_entries() const { return static_cast<int64_t>(tables[0].blocks.size()); }
  };

  // The cached prefix of a prompt: its length in blocks, and the chain key and anchor serial
  // after it.
  struct Chain {
    int64_t num_blocks = 0;
    uint64_t key = 0;
    uint64_t serial = 0;
  };

  // find_prefix's working space, reused so that admissions do not allocate.
  struct PrefixScratch {
    std::vector<uint64_t> keys, serials;
    std::vector<int32_t> anchor_blocks, blocks;
    std::vector<int64_t> runs;
    int64_t hit = 0;        // the blocks found
    uint64_t miss_key = 0;  // the anchor key after the chain, where the walk stopped at one
    bool has_miss = false;
  };

  // The last admission that did not fit, for retry_admission: its prompt, and the hit and the
  // blocks it found. Until a block enters a cache under one of its chain's keys (or the key
  // after them), a retry can only find a prefix of those blocks, so one that fits at none of
  // those hits fails without walking the prompt again.
  struct FailedAdmission {
    bool present = false;
    int64_t seq_id = 0;
    uint64_t extra_key = 0;
    std::vector<int32_t> tokens;
    int64_t hit = 0;
    int64_t chain = 0;            // blocks per group in `blocks`
    std::vector<int32_t> blocks;  // find_prefix's, group-major
    bool hit_bounds = false;      // no block has entered a cache under a watched key since
    KeyMap watched;               // the chain keys and the key after them (ids unused)
  };
  bool could_fit(const FailedAdmission& f, int64_t target, int64_t max_new_tokens) const;

  Chain find_prefix(TokenSpan tokens, uint64_t extra_key) const;
  int64_t first_needed(int64_t group, int64_t num_tokens) const;
  bool holds_content(int32_t block, uint64_t verify_serial, uint64_t extra_key,
                     const int32_t* tokens) const;

  static constexpr int64_t kNoTarget = INT64_MAX;  // admit_new: take max_new_tokens as they are
  int64_t admit_new(int64_t seq_id, TokenSpan tokens, int64_t target, int64_t max_new_tokens,
                    uint64_t extra_key);
  void check_admission(int64_t seq_id, TokenSpan tokens, int64_t target,
                       int64_t max_new_tokens) const;
  int64_t admit_checked(int64_t seq_id, TokenSpan tokens, int64_t target, int64_t max_new_tokens,
                        uint64_t extra_key);
  bool extend(Sequence& seq, TokenSpan new_tokens, int64_t num_new_tokens);
  void check_commit(const Sequence& seq, int64_t num_computed_tokens) const;
  void apply_commit(Sequence& seq, int64_t num_computed_tokens);
  int32_t cache_block(int64_t group, int32_t block, uint64_t key, uint64_t verify_serial,
                      uint64_t extra_key, const int32_t* tokens);
  void cache_next_full_block(Sequence& seq);
  void release_outside_window(Sequence& seq);
  static void mark_replaced(Table& table, int64_t index);

  Sequence& sequence(int64_t seq_id, const char* arg);
  const Sequence& sequence(int64_t seq_id, const char* arg) const;
  std::vector<Sequence*>& batch_sequences(IntSpan seq_ids);
  std::vector<BlockUpdate>& report(const std::vector<Sequence*>& batch, size_t n);
  void resolve(IntSpan seq_ids, const char* arg, std::vector<Sequence*>& out,
               uint64_t excluded_mark = 0, const char* excluded_arg = nullptr);
  const int32_t* check_allocate_args(size_t n, IntSpan new_token_ids, IntSpan new_token_counts,
                                     IntSpan num_new_tokens);
  int64_t extend_batch(const std::vector<Sequence*>& batch, const int32_t* tokens,
                       IntSpan new_token_counts, IntSpan num_new_tokens);

  void check_group(int64_t group) const;
  int32_t take_fresh_block(int64_t group);
  void claim(int32_t block);
  void release(int32_t block);
  void push_head(int32_t block);
  void push_tail(int32_t block);
  void unlink(int32_t block);
  void link_after(int32_t at, int32_t block);

  int64_t block_size_;
  bool prefix_caching_;
  int hash_bits_;
  uint64_t key_mask_;

  std::vector<Block> blocks_;
  // The free queue, threaded through the blocks: indices num_blocks and num_blocks+1 are the head
  // and tail sentinels; prev_[b] == -1 means block b is not queued.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  int32_t head_;
  int32_t tail_;
  int64_t num_free_;

  std::vector<Group> groups_;
  int64_t anchor_ = 0;  // the group whose cache chain verifies every hit: the first full one
  std::vector<int64_t> release_order_;  // the groups in the order free releases them
  std::vector<int32_t> cached_tokens_;  // block_size token ids per block, valid while cached
  uint64_t next_serial_;

  std::unordered_map<int64_t, Sequence> seqs_;
  FailedAdmission failed_;
  std::vector<std::pair<int32_t, int32_t>> pending_copies_;
  AllocatorStats stats_;

  // Scratch reused across calls so the per-step path does not allocate.
  mutable PrefixScratch prefix_;
  std::vector<int32_t> batch_tokens_;
  std::vector<Sequence*> batch_;
  std::vector<Sequence*> commits_;
  std::vector<Sequence*> frees_;
  std::vector<BlockUpdate> updates_;
  uint64_t batch_epoch_ = 0;
};

}  // namespace gnomon
