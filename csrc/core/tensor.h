#pragma once
// TensorView: the one way a tensor crosses into C++ — a borrowed pointer with its dtype, shape,
// strides (in elements) and device. The ops check every view they receive before touching memory.
#include <cstdint>
#include <initializer_list>
#include <string>

namespace gnomon {

enum class DType : int32_t { Float32 = 0, BFloat16 = 1, Float16 = 2, UInt8 = 3, Int32 = 4, Int64 = 5 };
enum class DeviceType : int32_t { CPU = 0, CUDA = 1, HIP = 2 };

const char* dtype_name(DType dtype);
int64_t dtype_size(DType dtype);
const char* device_name(DeviceType device);

// A view's sizes or strides, held inline: a view is built per tensor per op call, so building one
// allocates nothing. The ops take at most 4-D tensors; a view holds up to kMaxDims.
constexpr int64_t kMaxDims = 8;
class Dims {
 public:
  Dims() = default;
  explicit Dims(int64_t n) : n_(n) {}  // n <= kMaxDims (the caller checks), zero-filled
  int64_t size() const { return n_; }
  int64_t operator[](int64_t d) const { return values_[d]; }
  int64_t& operator[](int64_t d) { return values_[d]; }
  const int64_t* begin() const { return values_; }
  const int64_t* end() const { return values_ + n_; }

 private:
  int64_t values_[kMaxDims] = {};
  int64_t n_ = 0;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::Float32;
  Dims shape;
  Dims strides;
  DeviceType device = DeviceType::CPU;
  int32_t device_index = 0;
  uintptr_t stream = 0;  // the GPU stream to run on (torch's current stream); 0 on the CPU

  int64_t dim() const { return shape.size(); }
  int64_t size(int64_t d) const { return shape[d < 0 ? d + dim() : d]; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Whether each index of dim 0 (a row: one token) is contiguous, rows apart by strides[0] >= a
  // row's elements: a contiguous tensor, or a column slice of one as a fused QKV projection's
  // split gives. Sizes of 1 take any stride, as in is_contiguous.
  bool has_contiguous_rows() const;
  // Elements from one row to the next: strides[0], or a row's elements when there are <= 1 rows.
  int64_t row_stride() const;
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
// As check_dense, but rows (dim 0) may lie any stride >= a row's elements apart:
// has_contiguous_rows. The kernel indexes rows by row_stride().
void check_rows(const TensorView& t, const char* arg, std::initializer_list<DType> allowed,
                int64_t dim);

}  // namespace gnomon
