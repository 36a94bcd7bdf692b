#pragma once
// Register-blocked GEMMs with the columns of C in the vector lanes, shared by chunked-prefill
// attention (query rows in the lanes) and the MoE grouped GEMM (tokens in the lanes):
//   C[i][lane] = (c_scale ? C[i][lane] * c_scale[lane] : 0) + sum over k of A(i, k) * B[k][lane]
// A is read a scalar at a time (a[i * ai + k * ak], broadcast against a vector of B's row k), so
// nothing is summed across lanes and A may be any strided matrix: a key tile, decoded weight
// rows. The bf16 variant takes A and B as 32-bit words of two bfloat16 values (pairs along k)
// and accumulates both products of a pair in float32 with vdpbf16ps.
#include <algorithm>
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
// The same product on AMX tiles (vec.h): C[r][lane] (+)= sum over pairs p of A[r][p] . B[p][lane]
// in float32, in blocks of up to 2 x 2 C tiles; a block of one or two C tiles takes the pair of
// C tiles (0-1 or 2-3) that the block before it did not, so loading it need not wait for that
// block's last product and store. A's rows are ai words apart, B's and C's rows `lanes`.
// TDPBF16PS reads bf16 subnormals as zero, as vdpbf16ps does. The caller
// brackets its blocks with amx_begin() and amx_end().

// Compile-time loops over the C tiles of a block: f(integral_constant<i>, integral_constant<j>).
template <int RT, int CT, typename Fn, int... I>
GNOMON_INLINE void for_tiles(Fn&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I / CT>{}, std::integral_constant<int, I % CT>{}), ...);
}
template <int RT, int CT, typename Fn>
GNOMON_INLINE void for_tiles(Fn&& f) {
  for_tiles<RT, CT>(f, std::make_integer_sequence<int, RT * CT>{});
}

// A block of RT x CT C tiles, C0 .. C0 + RT * CT - 1, whose rows are `lanes` floats apart: A tile
// i is 4 + i, B tile j is 6 + j. amx_c_begin loads C (or zeroes it), amx_products adds A . B
// over `pairs` pairs (a multiple of 16), calling after_step(s, steps) once the products of each
// of its `steps` steps of kAmxPairs pairs are issued, and amx_c_end stores C.
template <int RT, int CT, int C0>
GNOMON_INLINE void amx_c_begin(const float* c, int64_t lanes, bool accumulate) {
  for_tiles<RT, CT>([&](auto i, auto j) {
    if (accumulate) {
      tile_load<C0 + i * CT + j>(c + i * kAmxRows * lanes + j * 16, lanes * 4);
    } else {
      tile_zero<C0 + i * CT + j>();
    }
  });
}
// How far ahead (in pairs) amx_products fetches B's rows where B has more than 16 lanes: its
// tiles then read a 64-byte part of each row, strides the hardware prefetchers did not follow
// (fused_moe T=256 measured 0.93x the time); 16-lane rows are consecutive lines, which they do.
constexpr int64_t kBPrefetchPairs = 16;
template <int RT, int CT, int C0, typename After>
GNOMON_INLINE void amx_products(const uint32_t* a, int64_t ai, const uint32_t* b, int64_t lanes,
                                int64_t pairs, const After& after_step) {
  for (int64_t p = 0; p < pairs; p += kAmxPairs) {
    if (lanes > 16 && p + kBPrefetchPairs < pairs) {
      const uint32_t* next = b + (p + kBPrefetchPairs) * lanes;
      for (int64_t q = 0; q < kAmxPairs; ++q) {
        for (int j = 0; j < CT; ++j) __builtin_prefetch(next + q * lanes + j * 16);
      }
    }
    // B first, then each A tile with its products: the first product waits for one A load, not
    // all of them (mxfp4_gemm M=8 A/B 0.98x the time; chunked prefill 0.945x, then 0.99x)
    for_tiles<1, CT>([&](auto, auto j) { tile_load<6 + j>(b + p * lanes + j * 16, lanes * 4); });
    for_tiles<RT, 1>([&](auto i, auto) {
      tile_load<4 + i>(a + i * kAmxRows * ai + p, ai * 4);
      for_tiles<1, CT>([&](auto, auto j) { tile_dot<C0 + i * CT + j, 4 + i, 6 + j>(); });
    });
    after_step(p / kAmxPairs, pairs / kAmxPairs);
  }
}
template <int RT, int CT, int C0>
GNOMON_INLINE void amx_c_end(float* c, int64_t lanes) {
  for_tiles<RT, CT>([&](auto i, auto j) {
    tile_store<C0 + i * CT + j>(c + i * kAmxRows * lanes + j * 16, lanes * 4);
  });
}

struct NoAfterStep {
  void operator()(int64_t, int64_t) const {}
};

// A whole block: C (+)= A . B.
template <int RT, int CT, int C0>
GNOMON_INLINE void amx_block(const uint32_t* a, int64_t ai, const uint32_t* b, int64_t lanes,
                             int64_t pairs, float* c, bool accumulate) {
  static_assert((RT * CT <= 2 && (C0 == 0 || C0 == 2)) || (RT * CT == 4 && C0 == 0));
  amx_c_begin<RT, CT, C0>(c, lanes, accumulate);
  amx_products<RT, CT, C0>(a, ai, b, lanes, pairs, NoAfterStep{});
  amx_c_end<RT, CT, C0>(c, lanes);
}

// C (+)= A . B over `pairs` pairs for `rows` rows and `lanes` lanes (multiples of 16), B's and C's
// rows ld floats apart: blocks of 2 x 2 C tiles (each A and B tile loaded serves two products;
// about 1.5x the rate of 2 x 1 blocks), the odd row tile and lane tile in smaller ones.
// after_block(i, n) runs after the i-th of the n blocks is issued, while its products are still
// in flight: work for the vector units to overlap with them.
template <typename After>
GNOMON_INLINE void amx_gemm(int64_t rows, const uint32_t* a, int64_t ai, const uint32_t* b,
                            int64_t lanes, int64_t ld, int64_t pairs, float* c, bool accumulate,
                            After&& after_block) {
  constexpr int64_t R = kAmxRows;
  const int64_t row_tiles = rows / R, lane_tiles = lanes / 16;
  const int64_t count = (row_tiles / 2 + row_tiles % 2) * (lane_tiles / 2 + lane_tiles % 2);
  int64_t done = 0;
  auto block = [&](auto rt, auto ct, int64_t r, int64_t v) {
    constexpr int RT = decltype(rt)::value, CT = decltype(ct)::value;
    const uint32_t* ar = a + r * ai;
    float* cr = c + r * ld + v;
    if (RT * CT < 4 && done % 2 == 1) {  // a small block takes the other pair of C tiles
      amx_block<RT, CT, RT * CT < 4 ? 2 : 0>(ar, ai, b + v, ld, pairs, cr, accumulate);
    } else {
      amx_block<RT, CT, 0>(ar, ai, b + v, ld, pairs, cr, accumulate);
    }
    after_block(done++, count);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  for (int64_t v = 0; v < lanes; v += 32) {
    const bool two_lanes = v + 32 <= lanes;
    for (int64_t r = 0; r < rows; r += 2 * R) {
      const bool two_rows = r + 2 * R <= rows;
      if (two_rows && two_lanes) block(Two{}, Two{}, r, v);
      else if (two_rows) block(Two{}, One{}, r, v);
      else if (two_lanes) block(One{}, Two{}, r, v);
      else block(One{}, One{}, r, v);
    }
  }
}
#endif

// f(integral_constant<int, n>) for a run-time n in [1, N].
template <int N, typename Fn>
GNOMON_INLINE void with_constant(int n, Fn&& f) {
  if constexpr (N > 0) {
    if (n == N) return f(std::integral_constant<int, N>{});
    with_constant<N - 1>(n, f);
  }
}

// C (`count` rows of `lanes` floats, ld apart as B's rows are; lanes a whole number of vectors)
// in register blocks of NI rows by RV lane vectors; the rows past the last whole block in one
// block, the vectors past the last whole block one by one. kDot: A and B are bf16 pairs
// (uint32_t), depth and the strides count pairs.
template <typename V, bool kDot, int RV, int NI>
GNOMON_INLINE void lanes_gemm(int64_t count, const void* a, int64_t ai, int64_t ak, int64_t depth,
                              const void* b, float* c, int64_t lanes, int64_t ld,
                              const float* c_scale) {
  const int64_t vectors = lanes / V::L;
  // The lambdas are always inlined: one left out of line is built for the baseline target, not
  // for the caller's (the narrow path's x86-64-v4 clone ran 32x slower so)
  auto block = [&](auto ni, auto rv, int64_t i, int64_t v) __attribute__((always_inline)) {
    constexpr int kRows = decltype(ni)::value, kVectors = decltype(rv)::value;
    const int64_t lane = v * V::L;
    const float* scale = c_scale != nullptr ? c_scale + lane : nullptr;
    if constexpr (kDot) {
#if GNOMON_HAS_WIDE_KERNELS
      gemm_lanes_bf16<kRows, kVectors>(static_cast<const uint32_t*>(a) + i * ai, ai, ak, depth,
                                       static_cast<const uint32_t*>(b) + lane, ld,
                                       c + i * ld + lane, ld, scale);
#endif
    } else {
      gemm_lanes<V, kRows, kVectors>(static_cast<const float*>(a) + i * ai, ai, ak, depth,
                                     static_cast<const float*>(b) + lane, ld,
                                     c + i * ld + lane, ld, scale);
    }
  };
  using One = std::integral_constant<int, 1>;
  using Rows = std::integral_constant<int, NI>;
  using Vectors = std::integral_constant<int, RV>;
  // All of the rows against the lanes of `rv` vectors from vector v, which stay in L1 meanwhile;
  // the rows past the last whole block as one block, whose B vectors serve them all
  auto strip = [&](auto rv, int64_t v) __attribute__((always_inline)) {
    int64_t i = 0;
    for (; i + NI <= count; i += NI) block(Rows{}, rv, i, v);
    with_constant<NI - 1>(static_cast<int>(count - i),
                          [&](auto ni) __attribute__((always_inline)) { block(ni, rv, i, v); });
  };
  for (int64_t v = 0; v < vectors; v += RV) {
    if (v + RV <= vectors) {
      strip(Vectors{}, v);
    } else {
      for (int64_t u = v; u < vectors; ++u) strip(One{}, u);
    }
  }
}

}  // namespace gnomon::cpu
