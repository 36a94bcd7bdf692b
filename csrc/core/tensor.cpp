#include "core/tensor.h"

#include <cstdint>
#include <sstream>

#include "core/errors.h"

namespace gnomon {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return "unknown";
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32: case DType::Int32: return 4;
    case DType::BFloat16: case DType::Float16: return 2;
    case DType::UInt8: return 1;
    case DType::Int64: return 8;
  }
  return 0;
}

const char* device_name(DeviceType device) {
  switch (device) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::HIP: return "hip";
  }
  return "unknown";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // as torch says: no element to be out of place
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

int64_t TensorView::row_stride() const {
  if (dim() == 0) return 1;
  if (shape[0] > 1) return strides[0];
  int64_t row = 1;
  for (int64_t d = 1; d < dim(); ++d) row *= shape[d];
  return row;
}

bool TensorView::has_contiguous_rows() const {
  if (numel() == 0 || dim() == 0) return true;
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 1; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  // `expected` is a row's elements; the last row must end within int64 elements of the first.
  return shape[0] == 1 ||
         (strides[0] >= expected && strides[0] <= (INT64_MAX - expected) / (shape[0] - 1));
}

std::string TensorView::describe() const {
  std::ostringstream out;
  out << dtype_name(dtype) << "[";
  for (int64_t d = 0; d < dim(); ++d) out << (d ? ", " : "") << shape[d];
  out << "] on " << device_name(device);
  return out.str();
}

void check_dtype(const TensorView& t, const char* arg, std::initializer_list<DType> allowed) {
  for (const DType d : allowed) {
    if (t.dtype == d) return;
  }
  std::ostringstream names;
  for (const DType d : allowed) names << (names.tellp() > 0 ? " or " : "") << dtype_name(d);
  raise<TypeError>(arg, ": expected dtype ", names.str(), ", got ", dtype_name(t.dtype));
}

void check_dim(const TensorView& t, const char* arg, int64_t dim) {
  if (t.dim() != dim) {
    raise<ValueError>(arg, ": expected a ", dim, "-D tensor, got ", t.describe());
  }
}

void check_shape(const TensorView& t, const char* arg, std::initializer_list<int64_t> shape) {
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  int64_t d = 0;
  for (auto it = shape.begin(); ok && it != shape.end(); ++it, ++d) {
    ok = *it < 0 || t.shape[d] == *it;
  }
  if (ok) return;
  std::ostringstream want;
  d = 0;
  for (const int64_t s : shape) {
    want << (d++ ? ", " : "");
    if (s < 0) {
      want << "*";
    } else {
      want << s;
    }
  }
  raise<ValueError>(arg, ": expected shape [", want.str(), "], got ", t.describe());
}

void check_contiguous(const TensorView& t, const char* arg) {
  if (!t.is_contiguous()) {
    raise<ValueError>(arg, ": expected a contiguous tensor (call .contiguous()), got ",
                      t.describe(), " with non-contiguous strides");
  }
}

void check_rows(const TensorView& t, const char* arg, std::initializer_list<DType> allowed,
                int64_t dim) {
  check_dtype(t, arg, allowed);
  check_dim(t, arg, dim);
  if (!t.has_contiguous_rows()) {
    std::ostringstream strides;
    for (int64_t d = 0; d < t.dim(); ++d) strides << (d ? ", " : "") << t.strides[d];
    raise<ValueError>(arg, ": expected each row (index of dim 0) contiguous and rows a stride of "
                      "at least a row's elements apart, as a contiguous tensor or a column "
                      "slice of one is (call .contiguous()), got ", t.describe(),
                      " with strides [", strides.str(), "]");
  }
}

void check_same_device(const TensorView& t, const char* arg, const TensorView& reference,
                       const char* reference_arg) {
  if (t.device != reference.device || t.device_index != reference.device_index) {
    raise<ValueError>(arg, ": expected a tensor on the same device as ", reference_arg, " (",
                      device_name(reference.device), ":", reference.device_index, "), got ",
                      device_name(t.device), ":", t.device_index);
  }
}

void check_dense(const TensorView& t, const char* arg, std::initializer_list<DType> allowed,
                 int64_t dim) {
  check_dtype(t, arg, allowed);
  check_dim(t, arg, dim);
  check_contiguous(t, arg);
}

}  // namespace gnomon
