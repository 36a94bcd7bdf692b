#pragma once

// The prefix cache's index of one KV-cache group: chain key -> block id.
//
// Open addressing over a power-of-two table kept at most half full: a key's home slot is its
// Fibonacci hash (the multiply spreads the narrow keys that hash_bits < 64 gives, too), a
// collision probes the next slots, and an erase shifts the entries behind it back, so no
// tombstones build up under the cache's steady insert/evict churn. A lookup is a multiply and,
// at that load, one or two adjacent slots, where a node-based std::unordered_map takes a
// modulo and a pointer chase.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gnomon {

class KeyMap {
 public:
  static constexpr int32_t kAbsent = -1;  // block ids are >= 0

  // Room for `n` entries without growing.
  void reserve(size_t n) {
    size_t capacity = 8;
    while (capacity < 2 * n) capacity *= 2;
    if (capacity > ids_.size()) rehash(capacity);
  }

  int32_t find(uint64_t key) const {
    if (size_ == 0) return kAbsent;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (ids_[i] == kAbsent) return kAbsent;
      if (keys_[i] == key) return ids_[i];
    }
  }

  // The id slot of `key`, inserting `id` there when the key is absent: (slot, inserted). The
  // pointer stays valid until the next insert or erase.
  std::pair<int32_t*, bool> try_emplace(uint64_t key, int32_t id) {
    if (2 * (size_ + 1) > ids_.size()) rehash(ids_.empty() ? 8 : 2 * ids_.size());
    size_t i = home(key);
    for (; ids_[i] != kAbsent; i = (i + 1) & mask_) {
      if (keys_[i] == key) return {&ids_[i], false};
    }
    keys_[i] = key;
    ids_[i] = id;
    ++size_;
    return {&ids_[i], true};
  }

  bool erase(uint64_t key) {
    if (size_ == 0) return false;
    size_t i = home(key);
    for (; keys_[i] != key || ids_[i] == kAbsent; i = (i + 1) & mask_) {
      if (ids_[i] == kAbsent) return false;
    }
    // Backward shift: move up each later entry of the run whose home does not lie in (i, j].
    for (size_t j = (i + 1) & mask_; ids_[j] != kAbsent; j = (j + 1) & mask_) {
      const size_t h = home(keys_[j]);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        keys_[i] = keys_[j];
        ids_[i] = ids_[j];
        i = j;
      }
    }
    ids_[i] = kAbsent;
    --size_;
    return true;
  }

  size_t size() const { return size_; }

  void clear() {
    std::fill(ids_.begin(), ids_.end(), kAbsent);
    size_ = 0;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (ids_[i] != kAbsent) f(keys_[i], ids_[i]);
    }
  }

 private:
  size_t home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_);
  }

  void rehash(size_t capacity) {
    std::vector<uint64_t> keys(capacity);
    std::vector<int32_t> ids(capacity, kAbsent);
    keys.swap(keys_);
    ids.swap(ids_);
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != kAbsent) try_emplace(keys[i], ids[i]);
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> ids_;  // kAbsent: an empty slot
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace gnomon
