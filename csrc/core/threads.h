#pragma once
// The number of worker threads the CPU kernels may use. Defaults to the hardware concurrency;
// the Python layer sets it from torch.get_num_threads() unless the user sets it.
namespace gnomon {

int num_threads();
void set_num_threads(int n);  // n >= 1, else ValueError

}  // namespace gnomon
