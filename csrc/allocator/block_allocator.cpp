#include "allocator/block_allocator.h"

#include <algorithm>
#include <climits>

#include "core/errors.h"

namespace gnomon {
namespace {

constexpr int32_t kUnlinked = -1;
// Serial numbers name cache entries. A block computed on top of no cached entry has no serial,
// and its descendants are not cached: they could never be reached by a lookup.
constexpr uint64_t kNoSerial = 0;
constexpr uint64_t kRootSerial = 1;
constexpr uint64_t kFirstSerial = 2;

uint64_t mix64(uint64_t x) {  // the splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

uint64_t BlockAllocator::hash_block(uint64_t parent_key, const int32_t* tokens, size_t count,
                                    uint64_t extra_key) {
  uint64_t h = mix64(mix64(parent_key ^ 0x9e3779b97f4a7c15ULL) ^ extra_key);
  for (size_t i = 0; i < count; ++i) {
    h = (h ^ static_cast<uint32_t>(tokens[i])) * 0x100000001b3ULL;
  }
  return mix64(h);
}

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching,
                               int hash_bits, std::vector<int64_t> windows)
    : block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      hash_bits_(hash_bits),
      num_free_(num_blocks),
      next_serial_(kFirstSerial) {
  if (num_blocks < 1 || num_blocks > kMaxBlocks) {
    raise<ValueError>("num_blocks: expected an integer in [1, ", kMaxBlocks, "], got ", num_blocks);
  }
  if (block_size < 1 || block_size > kMaxBlockSize) {
    raise<ValueError>("block_size: expected an integer in [1, ", kMaxBlockSize, "], got ",
                      block_size);
  }
  if (hash_bits < 1 || hash_bits > 64) {
    raise<ValueError>("hash_bits: expected an integer in [1, 64], got ", hash_bits);
  }
  if (windows.empty()) {
    raise<ValueError>("groups: expected at least one KV-cache group, got none");
  }
  for (size_t g = 0; g < windows.size(); ++g) {
    if (windows[g] < 0) {
      raise<ValueError>("groups: entry ", g, " has sliding window ", windows[g],
                        "; a window must be >= 1 (or full attention)");
    }
  }
  groups_.resize(windows.size());
  for (size_t g = 0; g < windows.size(); ++g) groups_[g].window = windows[g];
  const auto full = std::find(windows.begin(), windows.end(), kFullAttention);
  anchor_ = full == windows.end() ? 0 : full - windows.begin();
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (g != anchor_) release_order_.push_back(g);
  }
  release_order_.push_back(anchor_);
  key_mask_ = hash_bits == 64 ? ~uint64_t{0} : (uint64_t{1} << hash_bits) - 1;
  const auto n = static_cast<int32_t>(num_blocks);
  blocks_.resize(n);
  head_ = n;
  tail_ = n + 1;
  prev_.resize(n + 2);
  next_.resize(n + 2);
  prev_[head_] = kUnlinked;
  next_[tail_] = kUnlinked;
  int32_t last = head_;
  for (int32_t b = 0; b < n; ++b) {
    next_[last] = b;
    prev_[b] = last;
    last = b;
  }
  next_[last] = tail_;
  prev_[tail_] = last;
  if (prefix_caching_) {
    cached_tokens_.resize(static_cast<size_t>(num_blocks) * block_size);
    for (Group& group : groups_) group.cache.reserve(n);
  }
}

// ---------------------------------------------------------------------------------------------
// The free queue

void BlockAllocator::link_after(int32_t at, int32_t block) {
  const int32_t after = next_[at];
  prev_[block] = at;
  next_[block] = after;
  next_[at] = block;
  prev_[after] = block;
  ++num_free_;
}

void BlockAllocator::push_head(int32_t block) { link_after(head_, block); }

void BlockAllocator::push_tail(int32_t block) { link_after(prev_[tail_], block); }

void BlockAllocator::unlink(int32_t block) {
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  prev_[block] = next_[block] = kUnlinked;
  --num_free_;
}

int32_t BlockAllocator::take_fresh_block(int64_t group) {
  const int32_t block = next_[head_];
  unlink(block);
  Block& b = blocks_[block];
  if (b.cached) {
    groups_[b.group].cache.erase(b.key);
    b.cached = false;
    ++stats_.evictions;
    ++groups_[b.group].stats.evictions;
  }
  b.ref_count = 1;
  b.group = static_cast<int32_t>(group);
  ++groups_[group].stats.blocks_in_use;
  return block;
}

void BlockAllocator::claim(int32_t block) {
  Block& b = blocks_[block];
  if (b.ref_count++ == 0) {
    unlink(block);
    ++groups_[b.group].stats.blocks_in_use;
  }
}

void BlockAllocator::release(int32_t block) {
  Block& b = blocks_[block];
  if (--b.ref_count == 0) {
    --groups_[b.group].stats.blocks_in_use;
    if (b.cached) {
      push_tail(block);
    } else {
      push_head(block);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The prefix cache

bool BlockAllocator::holds_content(int32_t block, uint64_t verify_serial, uint64_t extra_key,
                                   const int32_t* tokens) const {
  const Block& b = blocks_[block];
  const int32_t* stored = cached_tokens_.data() + static_cast<size_t>(block) * block_size_;
  return b.verify_serial == verify_serial && b.extra_key == extra_key &&
         std::equal(tokens, tokens + block_size_, stored);
}

int64_t BlockAllocator::first_needed(int64_t group, int64_t num_tokens) const {
  // The next token to compute sits at position num_tokens and attends to the positions
  // num_tokens - window + 1 .. num_tokens: blocks wholly before the first of those are not needed.
  const int64_t window = groups_[group].window;
  if (window == kFullAttention) return 0;
  return std::max<int64_t>(0, num_tokens - window + 1) / block_size_;
}

// The longest cached prefix that every group can serve. The anchor group's chain is walked and
// verified entry by entry through parent serials, as a single group always was; an entry's serial
// then names one exact prefix. Another group's block for block i counts only if it was cached
// against the anchor entry that this walk found for block i, so a block whose KV was computed on
// any other prefix never matches, even when its own older blocks are evicted. Each group needs
// only the blocks the window of the first new token sees (all of them for full attention).
// Leaves in prefix_.blocks, group-major, each group's block for each block of the anchor's
// chain (kNullBlock where it has none), until the next call.
BlockAllocator::Chain BlockAllocator::find_prefix(TokenSpan tokens, uint64_t extra_key) const {
  PrefixScratch& p = prefix_;
  p.keys.clear();
  p.serials.clear();
  p.anchor_blocks.clear();
  p.blocks.clear();
  p.hit = 0;
  p.has_miss = false;
  if (!prefix_caching_ || tokens.size == 0) return Chain{0, 0, kRootSerial};
  // Leave at least one token to compute, so a fully cached prompt still yields logits.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size) - 1) / block_size_;
  std::vector<uint64_t>& keys = p.keys;
  std::vector<uint64_t>& serials = p.serials;
  std::vector<int32_t>& anchor_blocks = p.anchor_blocks;
  uint64_t key = 0, serial = kRootSerial;
  const auto& anchor_cache = groups_[anchor_].cache;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t* block_tokens = tokens.data + i * block_size_;
    key = hash_block(key, block_tokens, block_size_, extra_key) & key_mask_;
    const int32_t entry = anchor_cache.find(key);
    if (entry == KeyMap::kAbsent || !holds_content(entry, serial, extra_key, block_tokens)) {
      p.miss_key = key;
      p.has_miss = true;
      break;
    }
    serial = blocks_[entry].serial;
    keys.push_back(key);
    serials.push_back(serial);
    anchor_blocks.push_back(entry);
  }
  const int64_t chain = static_cast<int64_t>(keys.size());
  const int64_t num_groups = this->num_groups();
  std::vector<int32_t>& blocks = p.blocks;
  blocks.assign(num_groups * chain, kNullBlock);
  // run[g * chain + i]: how many blocks up to i group g holds without a gap.
  std::vector<int64_t>& run = p.runs;
  run.assign(num_groups * chain, 0);
  for (int64_t g = 0; g < num_groups; ++g) {
    const auto& cache = groups_[g].cache;
    for (int64_t i = 0; i < chain; ++i) {
      int32_t block = kNullBlock;
      if (g == anchor_) {
        block = anchor_blocks[i];
      } else {
        const int32_t entry = cache.find(keys[i]);
        if (entry != KeyMap::kAbsent &&
            holds_content(entry, serials[i], extra_key, tokens.data + i * block_size_)) {
          block = entry;
        }
      }
      blocks[g * chain + i] = block;
      run[g * chain + i] = block == kNullBlock ? 0 : 1 + (i > 0 ? run[g * chain + i - 1] : 0);
    }
  }
  int64_t hit = chain;
  for (; hit > 0; --hit) {
    bool served = true;
    for (int64_t g = 0; g < num_groups && served; ++g) {
      served = run[g * chain + hit - 1] >= hit - first_needed(g, hit * block_size_);
    }
    if (served) break;
  }
  p.hit = hit;
  if (hit == 0) return Chain{0, 0, kRootSerial};
  return Chain{hit, keys[hit - 1], serials[hit - 1]};
}

int64_t BlockAllocator::lookup(TokenSpan tokens, uint64_t extra_key) const {
  return find_prefix(tokens, extra_key).num_blocks * block_size_;
}

int32_t BlockAllocator::cache_block(int64_t group, int32_t block, uint64_t key,
                                   uint64_t verify_serial, uint64_t extra_key,
                                   const int32_t* tokens) {
  const auto [entry, inserted] = groups_[group].cache.try_emplace(key, block);
  if (!inserted) {
    // The anchor keeps the entry it has: later entries may be chained on top of it. Elsewhere
    // an entry that does not verify against this prefix (its anchor entry evicted, or a
    // colliding key) gives its key to the block just computed.
    const int32_t other = *entry;
    if (group == anchor_ || holds_content(other, verify_serial, extra_key, tokens)) return other;
    blocks_[other].cached = false;
    *entry = block;
  }
  if (failed_.hit_bounds && failed_.watched.find(key) != KeyMap::kAbsent) {
    failed_.hit_bounds = false;  // a retry may find more now
  }
  Block& b = blocks_[block];
  b.cached = true;
  b.key = key;
  b.serial = next_serial_++;
  b.verify_serial = verify_serial;
  b.extra_key = extra_key;
  std::copy(tokens, tokens + block_size_,
            cached_tokens_.begin() + static_cast<size_t>(block) * block_size_);
  return block;
}

void BlockAllocator::cache_next_full_block(Sequence& seq) {
  const int64_t index = seq.num_full_committed++;
  if (seq.last_serial == kNoSerial) return;
  const int32_t* tokens = seq.tokens.data() + index * block_size_;
  const uint64_t key = hash_block(seq.last_key, tokens, block_size_, seq.extra_key) & key_mask_;
  seq.last_key = key;
  // The anchor first: its entry for this block names the prefix that the other groups' blocks
  // are cached against. A duplicate keeps the chain going through the entry already cached; a
  // collision ends it, and nothing after it is cached in any group. Elsewhere a duplicate
  // leaves this block uncached.
  const int32_t block = seq.tables[anchor_].blocks[index];
  const int32_t held = cache_block(anchor_, block, key, seq.last_serial, seq.extra_key, tokens);
  if (held != block && !holds_content(held, seq.last_serial, seq.extra_key, tokens)) {
    seq.last_serial = kNoSerial;
    return;
  }
  seq.last_serial = blocks_[held].serial;
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (g != anchor_) {
      cache_block(g, seq.tables[g].blocks[index], key, seq.last_serial, seq.extra_key, tokens);
    }
  }
}

void BlockAllocator::mark_replaced(Table& table, int64_t index) {
  const auto i = static_cast<int32_t>(index);
  if (index < table.num_reported &&
      std::find(table.replaced.begin(), table.replaced.end(), i) == table.replaced.end()) {
    table.replaced.push_back(i);
  }
}

// Block i holds positions [i * block_size, (i + 1) * block_size). With c tokens computed, the
// next token sits at position c and attends to c - window + 1 .. c, so block i is released once
// (i + 1) * block_size <= c - window + 1: then its last position, (i + 1) * block_size - 1, is
// older than the window of every token still to come. Its entry becomes kNullBlock.
void BlockAllocator::release_outside_window(Sequence& seq) {
  for (int64_t g = 0; g < num_groups(); ++g) {
    if (groups_[g].window == kFullAttention) continue;
    Table& table = seq.tables[g];
    const int64_t released = first_needed(g, seq.num_computed);
    for (int64_t i = table.num_released; i < released; ++i) {
      if (table.blocks[i] == kNullBlock) continue;
      release(table.blocks[i]);
      table.blocks[i] = kNullBlock;
      mark_replaced(table, i);
      ++groups_[g].stats.released;
    }
    table.num_released = std::max(table.num_released, released);
  }
}

bool BlockAllocator::reset_prefix_cache() {
  if (num_free_ != num_blocks()) return false;
  for (Group& group : groups_) {
    group.cache.for_each([&](uint64_t, int32_t block) { blocks_[block].cached = false; });
    group.cache.clear();
  }
  return true;
}

int64_t BlockAllocator::num_cached_blocks() const {
  int64_t n = 0;
  for (const Group& group : groups_) n += static_cast<int64_t>(group.cache.size());
  return n;
}

// ---------------------------------------------------------------------------------------------
// Sequences

BlockAllocator::Sequence& BlockAllocator::sequence(int64_t seq_id, const char* arg) {
  const auto found = seqs_.find(seq_id);
  if (found == seqs_.end()) raise<KeyError>(arg, ": unknown sequence id ", seq_id);
  return found->second;
}

const BlockAllocator::Sequence& BlockAllocator::sequence(int64_t seq_id, const char* arg) const {
  return const_cast<BlockAllocator*>(this)->sequence(seq_id, arg);
}

bool BlockAllocator::allocate(int64_t seq_id, TokenSpan new_tokens, int64_t num_new_tokens,
                              uint64_t extra_key) {
  if (num_new_tokens < 0) {
    raise<ValueError>("num_new_tokens: expected an integer >= 0, got ", num_new_tokens);
  }
  const auto found = seqs_.find(seq_id);
  if (found != seqs_.end()) return extend(found->second, new_tokens, num_new_tokens);
  return admit_new(seq_id, new_tokens, kNoTarget, num_new_tokens, extra_key) >= 0;
}

void BlockAllocator::check_admission(int64_t seq_id, TokenSpan tokens, int64_t target,
                                     int64_t max_new_tokens) const {
  if (seqs_.count(seq_id) != 0) {
    raise<ValueError>("seq_id: sequence id ", seq_id,
                      " is already present; admit takes a new sequence (allocate extends one)");
  }
  if (target < 0 || target > static_cast<int64_t>(tokens.size)) {
    raise<ValueError>("target: expected 0 <= target <= len(token_ids) = ", tokens.size, ", got ",
                      target);
  }
  if (max_new_tokens < 0) {
    raise<ValueError>("max_new_tokens: expected an integer >= 0, got ", max_new_tokens);
  }
}

int64_t BlockAllocator::admit(int64_t seq_id, TokenSpan tokens, int64_t target,
                              int64_t max_new_tokens, uint64_t extra_key) {
  check_admission(seq_id, tokens, target, max_new_tokens);
  return admit_checked(seq_id, tokens, target, max_new_tokens, extra_key);
}

int64_t BlockAllocator::retry_admission(int64_t seq_id, int64_t target, int64_t max_new_tokens,
                                        uint64_t extra_key) {
  FailedAdmission& f = failed_;
  if (!f.present || f.seq_id != seq_id) {
    if (!f.present) {
      raise<ValueError>("token_ids: None retries the last admission that did not fit, and "
                        "there is none (pass the token ids of sequence ", seq_id, ")");
    }
    raise<ValueError>("token_ids: None retries the last admission that did not fit, which was "
                      "of sequence ", f.seq_id, ", not ", seq_id, " (pass its token ids)");
  }
  if (extra_key != f.extra_key) {
    raise<ValueError>("extra_key: a retry (token_ids None) keeps the failed admission's ",
                      f.extra_key, ", got ", extra_key);
  }
  const TokenSpan tokens{f.tokens.data(), f.tokens.size()};
  check_admission(seq_id, tokens, target, max_new_tokens);
  if (f.hit_bounds && !could_fit(f, target, max_new_tokens)) {
    ++stats_.failed_allocations;
    return -1;
  }
  return admit_checked(seq_id, tokens, target, max_new_tokens, extra_key);
}

// Whether the admission fits at some hit h <= f.hit, its claimed blocks f.blocks' first h of
// each group: with no insertion under a watched key since it failed, the hit a walk would find
// now is one of those, with exactly those blocks. admit_new's test at each.
bool BlockAllocator::could_fit(const FailedAdmission& f, int64_t target,
                               int64_t max_new_tokens) const {
  const int64_t groups = num_groups(), width = f.hit + 1;
  std::vector<int64_t>& free_before = prefix_.runs;  // [g][i]: free blocks among f.blocks[g][<i]
  free_before.assign(groups * width, 0);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < f.hit; ++i) {
      const int32_t block = f.blocks[g * f.chain + i];
      free_before[g * width + i + 1] =
          free_before[g * width + i] + (block != kNullBlock && blocks_[block].ref_count == 0);
    }
  }
  for (int64_t h = f.hit; h >= 0; --h) {
    const int64_t computed = h * block_size_;
    const int64_t num_new = std::max<int64_t>(0, std::min(target - computed, max_new_tokens));
    if (num_new > num_blocks() * block_size_) continue;
    int64_t claimed_free = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t* before = free_before.data() + g * width;
      claimed_free += before[h] - before[first_needed(g, computed)];
    }
    if (groups * (ceil_div(computed + num_new, block_size_) - h) <= num_free_ - claimed_free) {
      return true;
    }
  }
  return false;
}

int64_t BlockAllocator::admit_checked(int64_t seq_id, TokenSpan tokens, int64_t target,
                                      int64_t max_new_tokens, uint64_t extra_key) {
  const int64_t cached = admit_new(seq_id, tokens, target, max_new_tokens, extra_key);
  FailedAdmission& f = failed_;
  f.present = f.hit_bounds = cached < 0;  // one that fits forgets the failed one
  if (cached >= 0) return cached;
  if (tokens.data != f.tokens.data()) f.tokens.assign(tokens.data, tokens.data + tokens.size);
  f.seq_id = seq_id;
  f.extra_key = extra_key;
  f.hit = prefix_.hit;
  f.chain = static_cast<int64_t>(prefix_.keys.size());
  f.blocks.assign(prefix_.blocks.begin(), prefix_.blocks.end());
  f.watched.clear();
  f.watched.reserve(prefix_.keys.size() + 1);
  for (const uint64_t key : prefix_.keys) f.watched.try_emplace(key, 0);
  if (prefix_.has_miss) f.watched.try_emplace(prefix_.miss_key, 0);
  return cached;
}

int64_t BlockAllocator::admit_new(int64_t seq_id, TokenSpan tokens, int64_t target,
                                  int64_t max_new_tokens, uint64_t extra_key) {
  const Chain chain = find_prefix(tokens, extra_key);
  const std::vector<int32_t>& claimed = prefix_.blocks;
  const auto chain_blocks = static_cast<int64_t>(claimed.size()) / num_groups();
  const int64_t hit = chain.num_blocks, computed = hit * block_size_;
  const int64_t num_new_tokens =
      target == kNoTarget ? max_new_tokens
                          : std::max<int64_t>(0, std::min(target - computed, max_new_tokens));
  int64_t claimed_free = 0;
  for (int64_t g = 0; g < num_groups(); ++g) {
    for (int64_t i = first_needed(g, computed); i < hit; ++i) {
      claimed_free += blocks_[claimed[g * chain_blocks + i]].ref_count == 0;
    }
  }
  const int64_t capacity = num_blocks() * block_size_;
  const int64_t num_table_blocks = ceil_div(computed + num_new_tokens, block_size_);
  if (num_new_tokens > capacity ||
      num_groups() * (num_table_blocks - hit) > num_free_ - claimed_free) {
    ++stats_.failed_allocations;
    return -1;
  }

  // Everything that can throw happens before the pool changes.
  Sequence seq;
  seq.tokens.assign(tokens.data, tokens.data + tokens.size);
  seq.tables.resize(num_groups());
  seq.num_computed = computed;
  seq.num_slots = computed + num_new_tokens;
  seq.num_full_committed = hit;
  seq.last_key = chain.key;
  seq.last_serial = chain.serial;
  seq.extra_key = extra_key;
  for (Table& table : seq.tables) table.blocks.reserve(num_table_blocks);
  Sequence& admitted = seqs_.emplace(seq_id, std::move(seq)).first->second;

  // Every group claims its hit before any takes a fresh block, which could evict a claimed one.
  for (int64_t g = 0; g < num_groups(); ++g) {
    Table& table = admitted.tables[g];
    table.num_released = first_needed(g, computed);
    table.blocks.assign(table.num_released, kNullBlock);
    for (int64_t i = table.num_released; i < hit; ++i) {
      const int32_t block = claimed[g * chain_blocks + i];
      claim(block);
      table.blocks.push_back(block);
    }
  }
  for (int64_t g = 0; g < num_groups(); ++g) {
    std::vector<int32_t>& blocks = admitted.tables[g].blocks;
    while (static_cast<int64_t>(blocks.size()) < num_table_blocks) {
      blocks.push_back(take_fresh_block(g));
    }
  }
  stats_.queries += static_cast<int64_t>(tokens.size);
  stats_.hits += computed;
  ++stats_.allocations;
  return computed;
}

bool BlockAllocator::extend(Sequence& seq, TokenSpan new_tokens, int64_t num_new_tokens) {
  if (num_new_tokens > num_blocks() * block_size_) {
    ++stats_.failed_allocations;
    return false;
  }
  const int64_t slots = seq.num_computed + num_new_tokens;
  const int64_t have = seq.num_entries();
  const int64_t want = ceil_div(slots, block_size_);
  // Blocks this step writes into that another sequence also holds get a private copy first.
  // They lie at or after the first written position, so the window has not released them.
  const int64_t first_written = seq.num_computed / block_size_;
  const int64_t last_shared_candidate = std::min(have, want);
  int64_t shared = 0;
  for (const Table& table : seq.tables) {
    for (int64_t i = first_written; i < last_shared_candidate; ++i) {
      shared += blocks_[table.blocks[i]].ref_count > 1;
    }
  }
  if (num_groups() * std::max<int64_t>(want - have, 0) + shared > num_free_) {
    ++stats_.failed_allocations;
    return false;
  }

  seq.tokens.insert(seq.tokens.end(), new_tokens.data, new_tokens.data + new_tokens.size);
  for (int64_t g = 0; g < num_groups(); ++g) {
    Table& table = seq.tables[g];
    table.blocks.reserve(std::max(want, have));
    for (int64_t i = first_written; shared > 0 && i < last_shared_candidate; ++i) {
      const int32_t source = table.blocks[i];
      if (blocks_[source].ref_count == 1) continue;
      const int32_t copy = take_fresh_block(g);
      --blocks_[source].ref_count;
      table.blocks[i] = copy;
      if (i * block_size_ < seq.num_computed) pending_copies_.emplace_back(source, copy);
      mark_replaced(table, i);
      --shared;
    }
    while (static_cast<int64_t>(table.blocks.size()) < want) {
      table.blocks.push_back(take_fresh_block(g));
    }
  }
  seq.num_slots = std::max(seq.num_slots, slots);
  ++stats_.allocations;
  return true;
}

void BlockAllocator::check_commit(const Sequence& seq, int64_t num_computed_tokens) const {
  if (num_computed_tokens < seq.num_computed) {
    raise<ValueError>("num_computed_tokens: ", num_computed_tokens,
                      " is below the sequence's ", seq.num_computed,
                      " computed tokens; it may not decrease");
  }
  if (num_computed_tokens > seq.num_slots) {
    raise<ValueError>("num_computed_tokens: ", num_computed_tokens, " is beyond the ",
                      seq.num_slots, " tokens allocated to the sequence");
  }
  if (num_computed_tokens > static_cast<int64_t>(seq.tokens.size())) {
    raise<ValueError>("num_computed_tokens: ", num_computed_tokens, " is beyond the ",
                      seq.tokens.size(), " token ids the allocator was given for the sequence");
  }
}

void BlockAllocator::apply_commit(Sequence& seq, int64_t num_computed_tokens) {
  seq.num_computed = num_computed_tokens;
  // Newly full blocks enter the cache before the window releases them.
  while (prefix_caching_ && (seq.num_full_committed + 1) * block_size_ <= num_computed_tokens) {
    cache_next_full_block(seq);
  }
  release_outside_window(seq);
}

void BlockAllocator::commit(int64_t seq_id, int64_t num_computed_tokens) {
  Sequence& seq = sequence(seq_id, "seq_id");
  check_commit(seq, num_computed_tokens);
  apply_commit(seq, num_computed_tokens);
}

void BlockAllocator::resolve(IntSpan seq_ids, const char* arg, std::vector<Sequence*>& out,
                             uint64_t excluded_mark, const char* excluded_arg) {
  const uint64_t epoch = ++batch_epoch_;
  out.clear();
  out.reserve(seq_ids.size);
  for (size_t i = 0; i < seq_ids.size; ++i) {
    const auto found = seqs_.find(seq_ids[i]);
    if (found == seqs_.end()) {
      raise<KeyError>(arg, ": unknown sequence id ", seq_ids[i], " at index ", i,
                      " (the batch forms take running sequences; admit new ones with allocate)");
    }
    Sequence& seq = found->second;
    if (seq.batch_mark == epoch) {
      raise<ValueError>(arg, ": sequence id ", seq_ids[i], " appears more than once");
    }
    if (excluded_mark != 0 && seq.batch_mark == excluded_mark) {
      raise<ValueError>(arg, ": sequence id ", seq_ids[i], " is also in ", excluded_arg,
                        "; a sequence freed in this step cannot be allocated in it");
    }
    seq.batch_mark = epoch;
    out.push_back(&seq);
  }
}

std::vector<BlockAllocator::Sequence*>& BlockAllocator::batch_sequences(IntSpan seq_ids) {
  resolve(seq_ids, "seq_ids", batch_);
  return batch_;
}

const int32_t* BlockAllocator::check_allocate_args(size_t n, IntSpan new_token_ids,
                                                   IntSpan new_token_counts,
                                                   IntSpan num_new_tokens) {
  if (new_token_counts.size != n) {
    raise<ValueError>("new_token_counts: expected ", n, " entries (one per seq_ids), got ",
                      new_token_counts.size);
  }
  if (num_new_tokens.size != n) {
    raise<ValueError>("num_new_tokens: expected ", n, " entries (one per seq_ids), got ",
                      num_new_tokens.size);
  }
  size_t total_tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t count = new_token_counts[i];
    if (count < 0 || static_cast<size_t>(count) > new_token_ids.size - total_tokens) {
      raise<ValueError>("new_token_counts: entry ", i, " is ", count,
                        "; the counts must be >= 0 and sum to len(new_token_ids) = ",
                        new_token_ids.size);
    }
    total_tokens += static_cast<size_t>(count);
    if (num_new_tokens[i] < 0) {
      raise<ValueError>("num_new_tokens: entry ", i, " is ", num_new_tokens[i],
                        "; expected integers >= 0");
    }
  }
  if (total_tokens != new_token_ids.size) {
    raise<ValueError>("new_token_counts: the counts sum to ", total_tokens,
                      " but new_token_ids holds ", new_token_ids.size, " ids");
  }
  if (!new_token_ids.is_int64) return static_cast<const int32_t*>(new_token_ids.data);
  batch_tokens_.resize(new_token_ids.size);
  for (size_t i = 0; i < new_token_ids.size; ++i) {
    const int64_t id = new_token_ids[i];
    if (id < INT32_MIN || id > INT32_MAX) {
      raise<ValueError>("new_token_ids: entry ", i, " = ", id, " is outside the int32 range");
    }
    batch_tokens_[i] = static_cast<int32_t>(id);
  }
  return batch_tokens_.data();
}

int64_t BlockAllocator::extend_batch(const std::vector<Sequence*>& batch, const int32_t* tokens,
                                     IntSpan new_token_counts, IntSpan num_new_tokens) {
  size_t offset = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto count = static_cast<size_t>(new_token_counts[i]);
    if (!extend(*batch[i], TokenSpan{tokens + offset, count}, num_new_tokens[i])) {
      return static_cast<int64_t>(i);
    }
    offset += count;
  }
  return static_cast<int64_t>(batch.size());
}

int64_t BlockAllocator::allocate_batch(IntSpan seq_ids, IntSpan new_token_ids,
                                       IntSpan new_token_counts, IntSpan num_new_tokens) {
  const int32_t* tokens =
      check_allocate_args(seq_ids.size, new_token_ids, new_token_counts, num_new_tokens);
  return extend_batch(batch_sequences(seq_ids), tokens, new_token_counts, num_new_tokens);
}

void BlockAllocator::commit_batch(IntSpan seq_ids, IntSpan num_computed_tokens) {
  if (num_computed_tokens.size != seq_ids.size) {
    raise<ValueError>("num_computed_tokens: expected ", seq_ids.size,
                      " entries (one per seq_ids), got ", num_computed_tokens.size);
  }
  std::vector<Sequence*>& batch = batch_sequences(seq_ids);
  for (size_t i = 0; i < batch.size(); ++i) check_commit(*batch[i], num_computed_tokens[i]);
  for (size_t i = 0; i < batch.size(); ++i) apply_commit(*batch[i], num_computed_tokens[i]);
}

int64_t BlockAllocator::step(IntSpan commit_seq_ids, const IntSpan* num_computed_tokens,
                             IntSpan free_seq_ids, IntSpan seq_ids, IntSpan new_token_ids,
                             IntSpan new_token_counts, IntSpan num_new_tokens) {
  // Everything is checked before anything changes.
  if (num_computed_tokens != nullptr && num_computed_tokens->size != commit_seq_ids.size) {
    raise<ValueError>("num_computed_tokens: expected ", commit_seq_ids.size,
                      " entries (one per commit_seq_ids), got ", num_computed_tokens->size);
  }
  resolve(commit_seq_ids, "commit_seq_ids", commits_);
  auto computed = [&](size_t i) {
    return num_computed_tokens ? (*num_computed_tokens)[i] : commits_[i]->num_slots;
  };
  for (size_t i = 0; i < commits_.size(); ++i) check_commit(*commits_[i], computed(i));
  resolve(free_seq_ids, "free_seq_ids", frees_);
  const uint64_t freed_mark = batch_epoch_;
  resolve(seq_ids, "seq_ids", batch_, freed_mark, "free_seq_ids");
  const int32_t* tokens =
      check_allocate_args(seq_ids.size, new_token_ids, new_token_counts, num_new_tokens);

  for (size_t i = 0; i < commits_.size(); ++i) apply_commit(*commits_[i], computed(i));
  for (size_t i = 0; i < free_seq_ids.size; ++i) free(free_seq_ids[i]);
  return extend_batch(batch_, tokens, new_token_counts, num_new_tokens);
}

void BlockAllocator::free(int64_t seq_id) {
  const auto found = seqs_.find(seq_id);
  if (found == seqs_.end()) raise<KeyError>("seq_id: unknown sequence id ", seq_id);
  // Position by position from the end, so a chain's tail is evicted first; at each position
  // the anchor last, so an anchor entry outlives the blocks cached against it.
  const Sequence& seq = found->second;
  for (int64_t i = seq.num_entries() - 1; i >= 0; --i) {
    for (const int64_t g : release_order_) {
      const int32_t block = seq.tables[g].blocks[i];
      if (block != kNullBlock) release(block);
    }
  }
  // A copy into a block nobody holds any more has nothing left to serve.
  pending_copies_.erase(std::remove_if(pending_copies_.begin(), pending_copies_.end(),
                                       [&](const std::pair<int32_t, int32_t>& copy) {
                                         return blocks_[copy.second].ref_count == 0;
                                       }),
                        pending_copies_.end());
  seqs_.erase(found);
}

void BlockAllocator::fork(int64_t parent_seq_id, int64_t child_seq_id) {
  const Sequence& parent = sequence(parent_seq_id, "parent_seq_id");
  if (seqs_.count(child_seq_id) != 0) {
    raise<ValueError>("child_seq_id: sequence id ", child_seq_id, " is already present");
  }
  if (parent.num_slots != parent.num_computed) {
    raise<ValueError>("parent_seq_id: sequence ", parent_seq_id, " has ",
                      parent.num_slots - parent.num_computed,
                      " allocated tokens not yet committed; fork it after commit");
  }
  Sequence child = parent;
  for (Table& table : child.tables) {
    table.num_reported = 0;  // new to whoever reads the updates: its first report is its table
    table.replaced.clear();
  }
  const Sequence& forked = seqs_.emplace(child_seq_id, std::move(child)).first->second;
  for (const Table& table : forked.tables) {
    for (const int32_t block : table.blocks) {
      if (block != kNullBlock) ++blocks_[block].ref_count;
    }
  }
}

std::vector<std::pair<int32_t, int32_t>> BlockAllocator::take_pending_copies() {
  std::vector<std::pair<int32_t, int32_t>> copies;
  copies.swap(pending_copies_);
  return copies;
}

std::vector<BlockUpdate>& BlockAllocator::take_block_updates(IntSpan seq_ids) {
  return report(batch_sequences(seq_ids), seq_ids.size);
}

std::vector<BlockUpdate>& BlockAllocator::take_step_updates(int64_t fitted) {
  return report(batch_, static_cast<size_t>(fitted));
}

std::vector<BlockUpdate>& BlockAllocator::report(const std::vector<Sequence*>& batch, size_t n) {
  updates_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Sequence& seq = *batch[i];
    BlockUpdate& update = updates_[i];
    update.full = seq.tables[0].num_reported == 0;
    update.groups.resize(seq.tables.size());
    for (size_t g = 0; g < seq.tables.size(); ++g) {
      Table& table = seq.tables[g];
      GroupUpdate& out = update.groups[g];
      const auto size = static_cast<int64_t>(table.blocks.size());
      out.appended = table.blocks.data() + table.num_reported;
      out.num_appended = static_cast<size_t>(size - table.num_reported);
      out.replaced.clear();
      for (const int32_t index : table.replaced) {
        out.replaced.emplace_back(index, table.blocks[index]);
      }
      table.replaced.clear();
      table.num_reported = size;
    }
  }
  return updates_;
}

// ---------------------------------------------------------------------------------------------
// Inspection

void BlockAllocator::check_group(int64_t group) const {
  if (group < 0 || group >= num_groups()) {
    raise<ValueError>("group: expected 0 <= group < ", num_groups(), " (the KV-cache groups), got ",
                      group);
  }
}

const std::vector<int32_t>& BlockAllocator::block_table(int64_t seq_id, int64_t group) const {
  check_group(group);
  return sequence(seq_id, "seq_id").tables[group].blocks;
}

int64_t BlockAllocator::num_computed_tokens(int64_t seq_id) const {
  return sequence(seq_id, "seq_id").num_computed;
}

int32_t BlockAllocator::ref_count(int64_t block_id) const {
  if (block_id < 0 || block_id >= num_blocks()) {
    raise<ValueError>("block_id: expected 0 <= block_id < ", num_blocks(), ", got ", block_id);
  }
  return blocks_[block_id].ref_count;
}

std::vector<int32_t> BlockAllocator::free_queue() const {
  std::vector<int32_t> order;
  order.reserve(num_free_);
  for (int32_t b = next_[head_]; b != tail_; b = next_[b]) order.push_back(b);
  return order;
}

std::vector<int32_t> BlockAllocator::cached_blocks() const {
  std::vector<int32_t> cached;
  cached.reserve(num_cached_blocks());
  for (const Group& group : groups_) {
    group.cache.for_each([&](uint64_t, int32_t block) { cached.push_back(block); });
  }
  std::sort(cached.begin(), cached.end());
  return cached;
}

}  // namespace gnomon
