// rotary_embedding, in place on query [T, Hq, D] and key [T, Hkv, D] (each token's heads contiguous,
// tokens their row strides apart: TensorView::row_stride).
//
// Decomposition: one block per token. The block's threads stride over the token's (Hq + Hkv) *
// rotary_dim/2 rotation pairs; each thread reads the pair's two elements, rotates them in float32
// and writes both back rounded to the element type. Dims past rotary_dim are never touched (the
// CPU op stores them back unchanged, which is the same bits). The token's cos/sin row is
// cos_sin_cache[pos]: cos in columns [0, rotary_dim/2), sin in [rotary_dim/2, rotary_dim).
// Pairs: NeoX (is_neox) rotates dims i and i + rotary_dim/2; GPT-J rotates 2i and 2i + 1.
// A position outside [0, max_pos) (which the host only checks for CPU tensors) leaves the
// token's query and key unchanged rather than reading out of bounds.
#include "gpu.h"
#include "kernels.h"

namespace gnomon::gpu {
namespace {

constexpr int kRotaryThreads = 128;

// The CPU op computes x1*cos - x2*sin and x2*cos + x1*sin as separately rounded products and a
// rounded sum (no FMA contraction), so the GPU does too: bit-identical results.
__device__ __forceinline__ float mul_sub(float a, float b, float c, float d) {
#if defined(GNOMON_GPU_AMD)
#pragma clang fp contract(off)
  return a * b - c * d;
#else
  return __fsub_rn(__fmul_rn(a, b), __fmul_rn(c, d));
#endif
}

__device__ __forceinline__ float mul_add(float a, float b, float c, float d) {
#if defined(GNOMON_GPU_AMD)
#pragma clang fp contract(off)
  return a * b + c * d;
#else
  return __fadd_rn(__fmul_rn(a, b), __fmul_rn(c, d));
#endif
}

template <typename T>
__global__ void __launch_bounds__(kRotaryThreads)
    rotary_kernel(const int64_t* __restrict__ positions, T* __restrict__ query,
                  T* __restrict__ key, const float* __restrict__ cos_sin_cache, int64_t max_pos,
                  int64_t rotary_dim, int64_t q_heads, int64_t k_heads, int64_t head_dim,
                  int64_t q_stride, int64_t k_stride, bool is_neox) {
  const int64_t t = blockIdx.x;
  const int64_t pos = positions[t];
  if (pos < 0 || pos >= max_pos) return;  // out of the cache: leave the token unchanged
  const int64_t half = rotary_dim / 2;
  const float* cos = cos_sin_cache + pos * rotary_dim;
  const float* sin = cos + half;
  const int64_t pairs = (q_heads + k_heads) * half;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t h = p / half, i = p % half;
    // a token's heads are contiguous; tokens lie their row strides apart
    T* head = h < q_heads ? query + t * q_stride + h * head_dim
                          : key + t * k_stride + (h - q_heads) * head_dim;
    const int64_t ia = is_neox ? i : 2 * i, ib = is_neox ? i + half : 2 * i + 1;
    const float x1 = to_float(head[ia]), x2 = to_float(head[ib]);
    const float c = cos[i], s = sin[i];
    head[ia] = from_float<T>(mul_sub(x1, c, x2, s));
    head[ib] = from_float<T>(mul_add(x2, c, x1, s));
  }
}

}  // namespace

void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView& key,
                      const TensorView& cos_sin_cache, bool is_neox) {
  const int64_t tokens = query.size(0), head_dim = query.size(2);
  const int64_t q_heads = query.size(1), k_heads = key.size(1);
  const int64_t max_pos = cos_sin_cache.size(0), rotary_dim = cos_sin_cache.size(1);
  if (tokens == 0 || q_heads + k_heads == 0 || rotary_dim < 2) return;
  if (tokens > 0x7fffffff) raise<ValueError>("rotary_embedding: too many tokens for one launch");
  dispatch_floating(query.dtype, [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<static_cast<unsigned>(tokens), kRotaryThreads, 0,
                       stream_of(query.stream)>>>(
        data<const int64_t>(positions), data<T>(query), data<T>(key),
        data<const float>(cos_sin_cache), max_pos, rotary_dim, q_heads, k_heads, head_dim,
        query.row_stride(), key.row_stride(), is_neox);
  });
  check_launch("rotary_embedding");
}

}  // namespace gnomon::gpu
