#include "cpu/vec.h"

#include "core/scalar_math.h"
#include "core/simd.h"

namespace gnomon::cpu {
namespace {

GNOMON_SIMD_CLONES void bf16_to_floats(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::bf16_to_float(src[i]);
}

GNOMON_SIMD_CLONES void floats_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::float_to_bf16(src[i]);
}

GNOMON_SIMD_CLONES void fp16_to_floats(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::fp16_to_float(src[i]);
}

void floats_to_fp16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::float_to_fp16(src[i]);
}

}  // namespace

void load_floats(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::BFloat16: bf16_to_floats(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::Float16: fp16_to_floats(static_cast<const uint16_t*>(src), dst, n); return;
    default: {
      const float* f = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f[i];
    }
  }
}

void store_floats(const float* src, DType dtype, void* dst, int64_t n) {
  switch (dtype) {
    case DType::BFloat16: floats_to_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::Float16: floats_to_fp16(src, static_cast<uint16_t*>(dst), n); return;
    default: {
      float* f = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) f[i] = src[i];
    }
  }
}

// Eight independent partial sums let the compiler keep several vector accumulators in flight.
GNOMON_SIMD_CLONES float dot(const float* a, const float* b, int64_t n) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 16; ++j) sum += partial[j];
  return sum;
}

float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

GNOMON_SIMD_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

GNOMON_SIMD_CLONES void scale(float alpha, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

}  // namespace gnomon::cpu
