#pragma once
// TensorView: the one way a tensor crosses into C++ — a borrowed pointer with its dtype, shape,
// strides (in elements) and device. The ops check every view they receive before touching memory.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace gnomon {

enum class DType : int32_t { Float32 = 0, BFloat16 = 1, Float16 = 2, UInt8 = 3, Int32 = 4, Int64 = 5 };
enum class DeviceType : int32_t { CPU = 0, CUDA = 1, HIP = 2 };

const char* dtype_name(DType dtype);
int64_t dtype_size(DType dtype);
const char* device_name(DeviceType device);

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DeviceType device = DeviceType::CPU;
  int32_t device_index = 0;
  uintptr_t stream = 0;  // the GPU stream to run on (torch's current stream); 0 on the CPU

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t d) const { return shape[d < 0 ? d + dim() : d]; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string describe() const;  // "bfloat16[4, 8] on cpu"

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Checks used by the op entries; each raises ValueError/TypeError naming `arg`.
void check_dtype(const TensorView& t, const char* arg, std::initializer_list<DType> allowed);
void check_dim(const TensorView& t, const char* arg, int64_t dim);
// `shape` entries of -1 match any size.
void check_shape(const TensorView& t, const char* arg, std::initializer_list<int64_t> shape);
void check_contiguous(const TensorView& t, const char* arg);
void check_same_device(const TensorView& t, const char* arg, const TensorView& reference,
                       const char* reference_arg);
// The dims, dtype and contiguity every dense operand needs: one call per argument.
void check_dense(const TensorView& t, const char* arg, std::initializer_list<DType> allowed,
                 int64_t dim);

}  // namespace gnomon
