#include "core/threads.h"

#include <atomic>
#include <thread>

#include "core/errors.h"

namespace gnomon {
namespace {

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

std::atomic<int> configured_threads{hardware_threads()};

}  // namespace

int num_threads() { return configured_threads.load(std::memory_order_relaxed); }

void set_num_threads(int n) {
  if (n < 1) raise<ValueError>("num_threads: expected an integer >= 1, got ", n);
  configured_threads.store(n, std::memory_order_relaxed);
}

}  // namespace gnomon
