#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/threads.h"

namespace gnomon {
namespace {

thread_local bool inside_parallel_region = false;

// How long a worker that finished a job, and a caller waiting for its helpers, poll before they
// block. Waking a blocked thread cost ~50 us on a 2-vCPU VM (the vCPU halts): a decode-sized
// fused_moe, two jobs, ran 9.6 us on one thread and a median 126 us on two. Polling yields the
// CPU, so a runnable thread (torch's OpenMP workers) is not held up by it.
constexpr auto kPoll = std::chrono::microseconds(200);

// Yields until ready() or kPoll has passed; returns ready().
template <typename Ready>
bool poll(const Ready& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kPoll;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void run(int64_t n, int64_t chunk, int threads, const std::function<void(int64_t, int64_t)>& body) {
    std::lock_guard<std::mutex> one_job_at_a_time(run_mutex_);
    while (static_cast<int>(workers_.size()) < threads - 1) {
      const int id = static_cast<int>(workers_.size());
      workers_.emplace_back([this, id] { work_loop(id); });
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      body_ = &body;
      n_ = n;
      chunk_ = chunk;
      next_.store(0);
      helpers_ = threads - 1;
      unfinished_ = threads - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    work_chunks();
    poll([this] { return unfinished_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return unfinished_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work_chunks() {
    inside_parallel_region = true;
    try {
      for (int64_t begin = next_.fetch_add(chunk_); begin < n_; begin = next_.fetch_add(chunk_)) {
        (*body_)(begin, std::min(n_, begin + chunk_));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_);
    }
    inside_parallel_region = false;
  }

  void work_loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      poll([&] { return generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && id < helpers_); });
        if (stopping_) return;
        seen = generation_;
      }
      work_chunks();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--unfinished_ == 0) done_.notify_one();
      }
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
  int helpers_ = 0;
  std::atomic<int> unfinished_{0};  // written under mutex_; polled without it
  std::atomic<uint64_t> generation_{0};
  bool stopping_ = false;
  std::exception_ptr error_;
};

ThreadPool& pool() {
  static ThreadPool* instance = new ThreadPool();  // never destroyed: workers may outlive main
  return *instance;
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (threads <= 1 || inside_parallel_region) {
    body(0, n);
    return;
  }
  // About four chunks per thread balances uneven work without much hand-out traffic.
  const int64_t chunk = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  pool().run(n, chunk, threads, body);
}

}  // namespace gnomon
