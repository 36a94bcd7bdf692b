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
#include <utility>

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

// ---- AMX -------------------------------------------------------------------------------------
//
// The same product on AMX tiles (vec.h): C[r][lane] (+)= sum over pairs p < depth of A[r][p] .
// B[p][lane] in float32, for rows, lanes and depth whole multiples of 16; A's rows are ai words
// apart, B's and C's rows `lanes` apart. A tile product's latency is several times its issue
// interval, so a block keeps four C tiles accumulating (64 rows x 16 lanes, 32 x 32 or 16 x 64)
// and loads alternate between two A or two B tiles; each tile loaded serves every product of
// its row or column. TDPBF16PS reads bf16 subnormals as zero, as vdpbf16ps does. The caller
// brackets its calls with amx_begin() and amx_end().

// The tile intrinsics take their tile numbers as literal tokens; these take them as templates.
// They are inline assembly in GCC's headers, so these need no target attribute (lambdas,
// which do not inherit one, call them).
#define GNOMON_TILE_CASES(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
template <int T>
GNOMON_INLINE void tile_load(const void* p, int64_t stride) {
#define GNOMON_TILE(t) if constexpr (T == t) _tile_loadd(t, p, stride);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
}
template <int T>
GNOMON_INLINE void tile_store(void* p, int64_t stride) {
#define GNOMON_TILE(t) if constexpr (T == t) _tile_stored(t, p, stride);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
}
template <int T>
GNOMON_INLINE void tile_zero() {
#define GNOMON_TILE(t) if constexpr (T == t) _tile_zero(t);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
}
template <int C, int A, int B>
GNOMON_INLINE void tile_dot() {
  static_assert(C < 4 && (A == 4 || A == 5) && (B == 6 || B == 7));
#define GNOMON_TILE(c)                                      \
  if constexpr (C == c) {                                   \
    if constexpr (A == 4 && B == 6) _tile_dpbf16ps(c, 4, 6); \
    if constexpr (A == 4 && B == 7) _tile_dpbf16ps(c, 4, 7); \
    if constexpr (A == 5 && B == 6) _tile_dpbf16ps(c, 5, 6); \
    if constexpr (A == 5 && B == 7) _tile_dpbf16ps(c, 5, 7); \
  }
  GNOMON_TILE(0) GNOMON_TILE(1) GNOMON_TILE(2) GNOMON_TILE(3)
#undef GNOMON_TILE
}
#undef GNOMON_TILE_CASES

// Compile-time loops over the C tiles of a block: f(integral_constant<i>, integral_constant<j>).
template <int RT, int CT, typename Fn, int... I>
GNOMON_INLINE void for_tiles(Fn&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I / CT>{}, std::integral_constant<int, I % CT>{}), ...);
}
template <int RT, int CT, typename Fn>
GNOMON_INLINE void for_tiles(Fn&& f) {
  for_tiles<RT, CT>(f, std::make_integer_sequence<int, RT * CT>{});
}

template <int RT, int CT>
GNOMON_TARGET_AMX inline void amx_block(const uint32_t* a, int64_t ai, int64_t depth,
                                               const uint32_t* b, int64_t lanes, float* c,
                                               bool accumulate) {
  static_assert(RT * CT <= 4 && (RT <= 2 || CT <= 2));
  const int64_t a_stride = ai * 4, b_stride = lanes * 4;
  auto c_tile = [&](auto i, auto j) { return c + i * kAmxRows * lanes + j * 16; };
  for_tiles<RT, CT>([&](auto i, auto j) {
    if (accumulate) {
      tile_load<i * CT + j>(c_tile(i, j), b_stride);
    } else {
      tile_zero<i * CT + j>();
    }
  });
  // A tile i is 4 + i and B tile j is 6 + j, except along the longer side of a 4 x 1 or 1 x 4
  // block, whose tiles take turns in 4 and 5 (or 6 and 7), each loaded just before its product.
  for (int64_t p = 0; p < depth; p += kAmxPairs) {
    if constexpr (RT <= 2) {
      for_tiles<RT, 1>([&](auto i, auto) { tile_load<4 + i>(a + i * kAmxRows * ai + p, a_stride); });
    }
    if constexpr (CT <= 2) {
      for_tiles<1, CT>([&](auto, auto j) { tile_load<6 + j>(b + p * lanes + j * 16, b_stride); });
    }
    for_tiles<RT, CT>([&](auto i, auto j) {
      constexpr int A = RT <= 2 ? 4 + i : 4 + i % 2, B = CT <= 2 ? 6 + j : 6 + j % 2;
      if constexpr (RT > 2) tile_load<A>(a + i * kAmxRows * ai + p, a_stride);
      if constexpr (CT > 2) tile_load<B>(b + p * lanes + j * 16, b_stride);
      tile_dot<i * CT + j, A, B>();
    });
  }
  for_tiles<RT, CT>([&](auto i, auto j) { tile_store<i * CT + j>(c_tile(i, j), b_stride); });
}

// Blocks of four C tiles where the shape allows, the rest in smaller ones.
GNOMON_TARGET_AMX inline void amx_gemm(int64_t rows, const uint32_t* a, int64_t ai, int64_t depth,
                                       const uint32_t* b, int64_t lanes, float* c,
                                       bool accumulate) {
  auto run = [&](auto rt, auto ct, int64_t i, int64_t v) {
    amx_block<decltype(rt)::value, decltype(ct)::value>(a + i * ai, ai, depth, b + v, lanes,
                                                        c + i * lanes + v, accumulate);
  };
  using T1 = std::integral_constant<int, 1>;
  using T2 = std::integral_constant<int, 2>;
  using T4 = std::integral_constant<int, 4>;
  const int64_t row_tiles = rows / kAmxRows, lane_tiles = lanes / 16;
  if (lane_tiles == 1) {
    int64_t t = 0;
    for (; t + 4 <= row_tiles; t += 4) run(T4{}, T1{}, t * kAmxRows, 0);
    for (; t + 2 <= row_tiles; t += 2) run(T2{}, T1{}, t * kAmxRows, 0);
    for (; t < row_tiles; ++t) run(T1{}, T1{}, t * kAmxRows, 0);
    return;
  }
  if (row_tiles == 1) {
    int64_t u = 0;
    for (; u + 4 <= lane_tiles; u += 4) run(T1{}, T4{}, 0, u * 16);
    for (; u + 2 <= lane_tiles; u += 2) run(T1{}, T2{}, 0, u * 16);
    for (; u < lane_tiles; ++u) run(T1{}, T1{}, 0, u * 16);
    return;
  }
  for (int64_t u = 0; u < lane_tiles; u += 2) {
    const bool two_lanes = u + 2 <= lane_tiles;
    for (int64_t t = 0; t < row_tiles; t += 2) {
      const bool two_rows = t + 2 <= row_tiles;
      if (two_rows && two_lanes) run(T2{}, T2{}, t * kAmxRows, u * 16);
      else if (two_rows) run(T2{}, T1{}, t * kAmxRows, u * 16);
      else if (two_lanes) run(T1{}, T2{}, t * kAmxRows, u * 16);
      else run(T1{}, T1{}, t * kAmxRows, u * 16);
    }
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
