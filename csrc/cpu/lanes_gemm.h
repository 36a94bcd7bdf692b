#pragma once
// Register-blocked GEMMs with the columns of C in the vector lanes, shared by chunked-prefill
// attention (query rows in the lanes) and the MoE grouped GEMM (tokens in the lanes):
//   C[i][lane] = (c_scale ? C[i][lane] * c_scale[lane] : 0) + sum over k of A(i, k) * B[k][lane]
// A is read a scalar at a time (a[i * ai + k * ak], broadcast against a vector of B's row k), so
// nothing is summed across lanes and A may be any strided matrix: a key tile, decoded weight
// rows. The bf16 variant takes A and B as 32-bit words of two bfloat16 values (pairs along k)
// and accumulates both products of a pair in float32 with vdpbf16ps.
#include <cstdint>
#include <type_traits>

#include "cpu/vec.h"

namespace gnomon::cpu {

// C[i][v] for i < NI and RV lane vectors; B and C rows are ldb and ldc floats apart.
template <typename V, int NI, int RV>
GNOMON_INLINE void gemm_lanes(const float* a, int64_t ai, int64_t ak, int64_t depth,
                              const float* b, int64_t ldb, float* c, int64_t ldc,
                              const float* c_scale) {
  using F = typename V::F;
  F acc[NI][RV];
  for (int i = 0; i < NI; ++i) {
    for (int v = 0; v < RV; ++v) {
      acc[i][v] = c_scale != nullptr
                      ? load<F>(c + i * ldc + v * V::L) * load<F>(c_scale + v * V::L)
                      : F{};
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    F bv[RV];
    for (int v = 0; v < RV; ++v) bv[v] = load<F>(b + k * ldb + v * V::L);
    for (int i = 0; i < NI; ++i) {
      const float av = a[i * ai + k * ak];  // scalar * vector: a broadcast operand
      for (int v = 0; v < RV; ++v) acc[i][v] += av * bv[v];
    }
  }
  for (int i = 0; i < NI; ++i) {
    for (int v = 0; v < RV; ++v) store(c + i * ldc + v * V::L, acc[i][v]);
  }
}

#if GNOMON_HAS_WIDE_KERNELS
// The same over bf16 pairs; depth counts pairs. A call, not inlined: its callers are built for
// every target, and a block is a thousand instructions.
template <int NI, int RV>
GNOMON_TARGET_BF16 void gemm_lanes_bf16(const uint32_t* a, int64_t ai, int64_t ak, int64_t depth,
                                        const uint32_t* b, int64_t ldb, float* c, int64_t ldc,
                                        const float* c_scale) {
  __m512 acc[NI][RV];
  for (int i = 0; i < NI; ++i) {
    for (int v = 0; v < RV; ++v) {
      acc[i][v] = c_scale != nullptr
                      ? bit_cast<__m512>(load<Wide::F>(c + i * ldc + v * 16) *
                                         load<Wide::F>(c_scale + v * 16))
                      : _mm512_setzero_ps();
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    __m512bh bv[RV];
    for (int v = 0; v < RV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + k * ldb + v * 16);
    for (int i = 0; i < NI; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i * ai + k * ak]));
      for (int v = 0; v < RV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
  for (int i = 0; i < NI; ++i) {
    for (int v = 0; v < RV; ++v) _mm512_storeu_ps(c + i * ldc + v * 16, acc[i][v]);
  }
}
#endif

// C (`count` rows of `lanes` floats, lanes a whole number of vectors) in register blocks of NI
// rows by RV lane vectors, the rest of the rows one by one, the rest of the vectors one by one.
// kDot: A and B are bf16 pairs (uint32_t), depth and the strides count pairs.
template <typename V, bool kDot, int RV, int NI>
GNOMON_INLINE void lanes_gemm(int64_t count, const void* a, int64_t ai, int64_t ak, int64_t depth,
                              const void* b, float* c, int64_t lanes, const float* c_scale) {
  const int64_t vectors = lanes / V::L;
  auto block = [&](auto ni, auto rv, int64_t i, int64_t v) {
    constexpr int kRows = decltype(ni)::value, kVectors = decltype(rv)::value;
    const int64_t lane = v * V::L;
    const float* scale = c_scale != nullptr ? c_scale + lane : nullptr;
    if constexpr (kDot) {
#if GNOMON_HAS_WIDE_KERNELS
      gemm_lanes_bf16<kRows, kVectors>(static_cast<const uint32_t*>(a) + i * ai, ai, ak, depth,
                                       static_cast<const uint32_t*>(b) + lane, lanes,
                                       c + i * lanes + lane, lanes, scale);
#endif
    } else {
      gemm_lanes<V, kRows, kVectors>(static_cast<const float*>(a) + i * ai, ai, ak, depth,
                                     static_cast<const float*>(b) + lane, lanes,
                                     c + i * lanes + lane, lanes, scale);
    }
  };
  using One = std::integral_constant<int, 1>;
  using Rows = std::integral_constant<int, NI>;
  using Vectors = std::integral_constant<int, RV>;
  for (int64_t v = 0; v < vectors; v += RV) {
    const bool whole = v + RV <= vectors;
    int64_t i = 0;
    for (; i + NI <= count; i += NI) {
      if (whole) {
        block(Rows{}, Vectors{}, i, v);
      } else {
        for (int64_t u = v; u < vectors; ++u) block(Rows{}, One{}, i, u);
      }
    }
    for (; i < count; ++i) {
      if (whole) {
        block(One{}, Vectors{}, i, v);
      } else {
        for (int64_t u = v; u < vectors; ++u) block(One{}, One{}, i, u);
      }
    }
  }
}

}  // namespace gnomon::cpu
