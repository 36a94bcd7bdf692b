#pragma once
// A small persistent thread pool for the CPU kernels. parallel_for splits [0, n) into chunks of at
// least `grain` items, hands them out dynamically to num_threads() threads (the caller is one of
// them) and returns when all are done. Nested calls run serially on the calling thread.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/threads.h"

namespace gnomon {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Hands out work items to the threads of one parallel_for, one at a time: each thread (ticket)
// walks its own contiguous share of the items in order, then helps with what is left of the
// others'. parallel_for alone hands out chunks of about n / (4 threads), so one thread that the
// OS preempts can hold up a decode call; here it holds up at most one small item, and each
// thread's items (fused_moe's weight streams) stay contiguous.
class ItemQueue {
 public:
  explicit ItemQueue(int64_t n)
      : n_(n), shares_(std::max<int64_t>(1, std::min<int64_t>(n, num_threads()))),
        next_(shares_) {
    for (int64_t p = 0; p < shares_; ++p) next_[p].store(begin(p), std::memory_order_relaxed);
  }
  int64_t tickets() const { return n_ == 0 ? 0 : shares_; }
  bool take(int64_t ticket, int64_t& item) {
    for (int64_t i = 0; i < shares_; ++i) {
      const int64_t p = (ticket + i) % shares_;
      item = next_[p].fetch_add(1, std::memory_order_relaxed);
      if (item < begin(p + 1)) return true;
    }
    return false;
  }

 private:
  int64_t begin(int64_t share) const { return n_ * share / shares_; }
  const int64_t n_, shares_;
  std::vector<std::atomic<int64_t>> next_;
};

}  // namespace gnomon
