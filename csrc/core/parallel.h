#pragma once
// A small persistent thread pool for the CPU kernels. parallel_for splits [0, n) into chunks of at
// least `grain` items, hands them out dynamically to num_threads() threads (the caller is one of
// them) and returns when all are done. Nested calls run serially on the calling thread.
#include <cstdint>
#include <functional>

namespace gnomon {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

}  // namespace gnomon
