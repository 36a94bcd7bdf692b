#pragma once
// Vector primitives for the CPU kernels, compiled for AVX-512, AVX2 and the baseline with runtime
// dispatch (core/simd.h). Kernels convert rows to float32 once, do their math here, and store.
#include <cstdint>

#include "core/tensor.h"

namespace gnomon::cpu {

// dst[i] = float(src[i]) for float32, bfloat16 or float16 `src`.
void load_floats(const void* src, DType dtype, float* dst, int64_t n);
// dst[i] = src[i] rounded to nearest even in `dtype`.
void store_floats(const float* src, DType dtype, void* dst, int64_t n);

float dot(const float* a, const float* b, int64_t n);
float sum_squares(const float* x, int64_t n);
void axpy(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
void scale(float alpha, float* x, int64_t n);                 // x *= alpha

}  // namespace gnomon::cpu
