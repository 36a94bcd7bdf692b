// MXFP4 (OCP MX v1.0): quantize, dequantize, and a GEMM that dequantises in registers.
//
// Layout (DESIGN.md): a row of K elements is K/32 blocks; block b has 16 bytes of E2M1 codes
// (element 2i in the low nibble of byte i) and one E8M0 scale byte. The element and scale codes
// come from core/scalar_math.h, which the GPU kernels share.
//
// The GEMM streams each weight row once per tile of activation rows and never builds the
// full-precision weight. Its inner loop works on "groups" of L/4 blocks (4L bytes, 8L elements)
// loaded as L 32-bit words: lane j holds word j, and shifting it right by 4*kh (kh = 0..7) brings
// element 8j + kh of the group into the low nibble. A table lookup (a permute) turns the nibbles
// into floats, one multiply applies each lane's block scale, and FMAs against the activations
// accumulate. The activations are copied once into float32 in the matching order
// (a_perm[g*8L + kh*L + j] = a[g*8L + 8j + kh]), so no element ever needs reordering. There are
// three kernels: 16-lane tiles of 4 activation rows x 4 weight rows (AVX-512), 8-lane tiles of up
// to 8 x 1 (everything else), and for bf16 activations on AVX512-BF16 a variant that decodes to
// bf16 and multiplies with vdpbf16ps (see its section). Work is split over weight rows.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "core/parallel.h"
#include "core/scalar_math.h"
#include "core/simd.h"
#include "cpu/kernels.h"
#include "cpu/vec.h"
#include "cpu/weight_rows.h"


#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define GNOMON_HAS_SHUFFLEVECTOR 1
#endif
#endif
#ifndef GNOMON_HAS_SHUFFLEVECTOR
#define GNOMON_HAS_SHUFFLEVECTOR 0
#endif

namespace gnomon::cpu {
namespace {

using math::kMxfp4BlockSize;

constexpr int64_t kBlockBytes = kMxfp4BlockSize / 2;

// Lane j of a group gets the scale of its block j/4 (`scale_word` holds the group's scale bytes,
// block 0 in the low byte). Mirrors math::e8m0_to_float: 2^(byte - 127), 0x00 -> 2^-127 (a
// subnormal), 0xFF -> NaN.
template <typename V>
GNOMON_INLINE typename V::F group_scales(uint32_t scale_word) {
  using U = typename V::U;
  U shift;
  for (int j = 0; j < V::L; ++j) shift[j] = 8 * (j / 4);
  const U byte = ((U{} + scale_word) >> shift) & 0xffu;
  U bits = byte << 23;
  bits = byte == 0u ? U{} + 0x00400000u : bits;
  bits = byte == static_cast<uint32_t>(math::kE8M0NaN) ? U{} + 0x7fc00000u : bits;
  return bit_cast<typename V::F>(bits);
}

// ---- quantize ----------------------------------------------------------------------------------

GNOMON_SIMD_CLONES void quantize_blocks(const float* x, uint8_t* packed, uint8_t* scales,
                                        int64_t blocks, math::ScaleRule rule) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = x + b * kMxfp4BlockSize;
    uint8_t* bytes = packed + b * kBlockBytes;
    // The largest magnitude as bits: integer order equals float order for |x|, and anything at
    // or above the infinity pattern is an Inf or a NaN.
    uint32_t amax_bits = 0;
    for (int i = 0; i < kMxfp4BlockSize; ++i) {
      amax_bits = std::max(amax_bits, math::float_to_bits(v[i]) & 0x7fffffffu);
    }
    if (amax_bits >= 0x7f800000u) {  // NaN or Inf: the NaN scale, so the block reads back NaN
      scales[b] = math::kE8M0NaN;
      memset(bytes, 0, kBlockBytes);
      continue;
    }
    // An all-zero block gets scale 0x00; its elements stay (signed) zeros.
    const uint8_t scale =
        amax_bits == 0 ? 0 : math::mxfp4_scale_byte(math::bits_to_float(amax_bits), rule);
    scales[b] = scale;
    // 1 / 2^(scale - 127) = 2^(127 - scale), a normal float for every byte the rules produce
    // (<= 253), so the product below is exactly the division by the scale.
    const float inverse = math::bits_to_float(static_cast<uint32_t>(254 - scale) << 23);
    for (int i = 0; i < kBlockBytes; ++i) {
      bytes[i] = static_cast<uint8_t>(math::float_to_e2m1(v[2 * i] * inverse) |
                                      (math::float_to_e2m1(v[2 * i + 1] * inverse) << 4));
    }
  }
}

// ---- dequantize --------------------------------------------------------------------------------

GNOMON_SIMD_CLONES void dequantize_blocks(const uint8_t* packed, const uint8_t* scales,
                                          float* out, int64_t blocks) {
  using V = Narrow;
  const V::F table = e2m1_table<V>();
  for (int64_t b = 0; b < blocks; ++b) {
    const float scale = math::e8m0_to_float(scales[b]);
    for (int half = 0; half < kBlockBytes / V::L; ++half) {
      const V::U words = widen<V>(packed + b * kBlockBytes + half * V::L);
      const V::F low = decode_nibbles<V>(table, words, 0) * scale;
      const V::F high = decode_nibbles<V>(table, words, 4) * scale;
      // Interleave: element 2i is the low nibble of byte i, 2i+1 the high one.
      float* dst = out + b * kMxfp4BlockSize + half * 2 * V::L;
#if GNOMON_HAS_SHUFFLEVECTOR
      store(dst, __builtin_shufflevector(low, high, 0, 8, 1, 9, 2, 10, 3, 11));
      store(dst + V::L, __builtin_shufflevector(low, high, 4, 12, 5, 13, 6, 14, 7, 15));
#else
      for (int i = 0; i < V::L; ++i) {
        dst[2 * i] = low[i];
        dst[2 * i + 1] = high[i];
      }
#endif
    }
  }
}

// ---- GEMM --------------------------------------------------------------------------------------

struct Gemm {
  const uint8_t* w;         // [N, K/2]
  const uint8_t* w_scales;  // [N, K/32]
  // The activations, float32 (bf16 for the bf16 kernel), permuted within each group of kGroup
  // elements, 0-padded to k_padded, and laid out group-major in blocks of row_block rows:
  // block b holds rows [b * row_block, (b + 1) * row_block), group by group, each group's rows
  // one after another. A tile's rows of a group are then one contiguous run at fixed offsets.
  const void* a;
  const float* bias;        // [N] or null
  void* out;                // [M, N]
  DType out_dtype;
  int64_t m, n, k, k_padded, row_block;

  // Element offset of row `row`, group 0, for groups of `group` elements.
  int64_t a_offset(int64_t row, int64_t group) const {
    return ((row / row_block) * (k_padded / group) * row_block + row % row_block) * group;
  }
};

// The weight rows [n0, n0 + NT) of a tile, one group (GroupBytes bytes, GroupBytes / 16 blocks)
// at a time. The last, partial group of each row is copied into a zero-padded buffer: code 0 at
// scale 2^-127 is 0, and the padded activations are 0 as well.
template <int NT, int GroupBytes>
struct TileRows {
  static constexpr int kGroupBlocks = GroupBytes / kBlockBytes;
  const Gemm& g;
  const int64_t n0, row_bytes, row_blocks, full_groups;
  alignas(64) uint8_t tail[NT][GroupBytes];
  uint8_t tail_scales[NT][4];

  GNOMON_INLINE TileRows(const Gemm& gemm, int64_t first_row)
      : g(gemm), n0(first_row), row_bytes(gemm.k / 2), row_blocks(gemm.k / kMxfp4BlockSize),
        full_groups(gemm.k / (2 * GroupBytes)) {
    const int64_t tail_blocks = row_blocks - full_groups * kGroupBlocks;
    if (tail_blocks == 0) return;
    for (int r = 0; r < NT; ++r) {
      memset(tail[r], 0, sizeof(tail[r]));
      memset(tail_scales[r], 0, sizeof(tail_scales[r]));
      memcpy(tail[r], g.w + (n0 + r) * row_bytes + full_groups * GroupBytes,
             tail_blocks * kBlockBytes);
      memcpy(tail_scales[r], g.w_scales + (n0 + r) * row_blocks + full_groups * kGroupBlocks,
             tail_blocks);
    }
  }

  GNOMON_INLINE const uint8_t* bytes(int r, int64_t group) const {
    return group < full_groups ? g.w + (n0 + r) * row_bytes + group * GroupBytes : tail[r];
  }

  // Asks for the same group of the next tile's rows (and, at group 0, their scales), so that
  // memory streams in while this tile computes: rows are short (K/2 bytes), too short for the
  // hardware prefetchers to ramp up on each one.
  GNOMON_INLINE void prefetch_next(int64_t group) const {
    const int64_t next = n0 + NT;
    for (int r = 0; r < NT && next + r < g.n; ++r) {
      __builtin_prefetch(g.w + (next + r) * row_bytes + group * GroupBytes);
    }
    if (group == 0 && next < g.n) {
      const int64_t scale_bytes = std::min<int64_t>(NT, g.n - next) * row_blocks;
      for (int64_t i = 0; i < scale_bytes; i += 64) {
        __builtin_prefetch(g.w_scales + next * row_blocks + i);
      }
    }
  }

  // The group's scale bytes, block 0 in the low byte.
  GNOMON_INLINE uint32_t scale_word(int r, int64_t group) const {
    const uint8_t* src = group < full_groups
                             ? g.w_scales + (n0 + r) * row_blocks + group * kGroupBlocks
                             : tail_scales[r];
    uint32_t word = 0;
    for (int i = 0; i < kGroupBlocks; ++i) word |= static_cast<uint32_t>(src[i]) << (8 * i);
    return word;
  }
};

// Float tiles: MT activation rows x NT weight rows, L-lane float32 FMAs. Each (m, n) pair keeps
// kAcc vector accumulators: together at least 8 independent FMA chains, enough to cover the FMA
// latency. The activations are float32 in the group order described at the top of the file.
template <typename V, int MaxMT, int TileNT>
struct FloatTiles {
  static constexpr int kMaxMT = MaxMT, kNT = TileNT, kLanes = V::L;
  static constexpr int64_t kGroup = 8 * V::L, kActivationBytes = 4;  // K elements per group
  using F = typename V::F;
  using U = typename V::U;
  const F table = e2m1_table<V>();

  template <int MT, int NT>
  GNOMON_INLINE void tile(const Gemm& g, int64_t m0, int64_t n0, float* res,
                          int64_t res_stride) const {
    constexpr int L = V::L;
    constexpr int kAcc = MT * NT >= 8 ? 1 : MT * NT >= 4 ? 2 : MT * NT >= 2 ? 4 : 8;
    const TileRows<NT, 4 * L> rows(g, n0);
    F acc[MT][NT][kAcc];
    for (int m = 0; m < MT; ++m) {
      for (int r = 0; r < NT; ++r) {
        for (int i = 0; i < kAcc; ++i) acc[m][r][i] = F{};
      }
    }
    const float* a_rows = static_cast<const float*>(g.a) + g.a_offset(m0, kGroup);
    for (int64_t grp = 0; grp < g.k_padded / kGroup; ++grp) {
      U words[NT];
      F scale[NT];
      rows.prefetch_next(grp);
      for (int r = 0; r < NT; ++r) {
        words[r] = load<U>(rows.bytes(r, grp));
        scale[r] = group_scales<V>(rows.scale_word(r, grp));
      }
      const float* a_group = a_rows + grp * MaxMT * kGroup;
#pragma GCC unroll 8
      for (int kh = 0; kh < 8; ++kh) {
        F weights[NT];
        for (int r = 0; r < NT; ++r) {
          weights[r] = decode_nibbles<V>(table, words[r], 4 * kh) * scale[r];
        }
        for (int m = 0; m < MT; ++m) {
          const F x = load<F>(a_group + m * kGroup + kh * L);
          for (int r = 0; r < NT; ++r) acc[m][r][kh % kAcc] += weights[r] * x;
        }
      }
    }
    for (int m = 0; m < MT; ++m) {
      for (int r = 0; r < NT; ++r) {
        F total = acc[m][r][0];
        for (int i = 1; i < kAcc; ++i) total += acc[m][r][i];
        res[m * res_stride + r] = reduce_add(total);
      }
    }
  }

  // Row `src` (K floats) into the group order, zero-padded to k_padded, group i at
  // dst + i * MaxMT * kGroup: dst[kh*L + j] of a group = src[g0 + 8j + kh].
  static void permute_row(const float* src, int64_t k, int64_t k_padded, float* dst) {
    for (int64_t g0 = 0; g0 < k_padded; g0 += kGroup, dst += MaxMT * kGroup) {
      for (int kh = 0; kh < 8; ++kh) {
        for (int j = 0; j < V::L; ++j) {
          const int64_t e = g0 + 8 * j + kh;
          dst[kh * V::L + j] = e < k ? src[e] : 0.0f;
        }
      }
    }
  }
};

using WideTiles = FloatTiles<Wide, 4, 4>;      // AVX-512: 16 accumulators
using NarrowTiles = FloatTiles<Narrow, 8, 1>;  // 8 lanes: 8 accumulators in 16 registers

// Output rows [m0, m0 + MT) of columns [n0, n1) into res (stride n1 - n0), NT weight rows at a
// time, the rest one by one.
template <typename Tiles, int MT>
GNOMON_INLINE void gemm_strip(const Gemm& g, const Tiles& tiles, int64_t m0, int64_t n0,
                              int64_t n1, float* res) {
  constexpr int NT = Tiles::kNT;
  int64_t n = n0;
  for (; n + NT <= n1; n += NT) tiles.template tile<MT, NT>(g, m0, n, res + n - n0, n1 - n0);
  for (; n < n1; ++n) tiles.template tile<MT, 1>(g, m0, n, res + n - n0, n1 - n0);
}

// The weight rows of one piece of work are cut into slices of about this many bytes, which stay
// in cache while every tile of activation rows streams past them.
constexpr int64_t kSliceBytes = 256 * 1024;

template <typename Tiles>
GNOMON_INLINE void gemm_rows(const Gemm& g, const Tiles& tiles, int64_t n_begin, int64_t n_end) {
  constexpr int MaxMT = Tiles::kMaxMT, NT = Tiles::kNT;
  const int64_t slice =
      std::max<int64_t>(NT, kSliceBytes / std::max<int64_t>(g.k / 2, 1) / NT * NT);
  std::vector<float> res(static_cast<size_t>(MaxMT * std::min(slice, n_end - n_begin)));
  for (int64_t s0 = n_begin; s0 < n_end; s0 += slice) {
    const int64_t s1 = std::min(n_end, s0 + slice), width = s1 - s0;
    for (int64_t m0 = 0; m0 < g.m; m0 += MaxMT) {
      const int mt = static_cast<int>(std::min<int64_t>(MaxMT, g.m - m0));
      switch (mt) {
#define GNOMON_MXFP4_CASE(MT)                                                                \
  case MT:                                                                                   \
    if constexpr (MT <= MaxMT) gemm_strip<Tiles, MT>(g, tiles, m0, s0, s1, res.data());     \
    break;
        GNOMON_MXFP4_CASE(1)
        GNOMON_MXFP4_CASE(2)
        GNOMON_MXFP4_CASE(3)
        GNOMON_MXFP4_CASE(4)
        GNOMON_MXFP4_CASE(5)
        GNOMON_MXFP4_CASE(6)
        GNOMON_MXFP4_CASE(7)
        GNOMON_MXFP4_CASE(8)
#undef GNOMON_MXFP4_CASE
        default: break;
      }
      for (int m = 0; m < mt; ++m) {
        float* values = res.data() + m * width;
        if (g.bias != nullptr) {
          for (int64_t i = 0; i < width; ++i) values[i] += g.bias[s0 + i];
        }
        char* dst = static_cast<char*>(g.out) + ((m0 + m) * g.n + s0) * dtype_size(g.out_dtype);
        store_floats(values, g.out_dtype, dst, width);
      }
    }
  }
}

GNOMON_SIMD_CLONES void gemm_rows_narrow(const Gemm& g, int64_t n_begin, int64_t n_end) {
  gemm_rows(g, NarrowTiles{}, n_begin, n_end);
}

// 16-lane tiles run only where AVX-512 is, so they are built for x86-64-v4 alone rather than
// cloned for targets that would never run them.
#if GNOMON_HAS_WIDE_KERNELS
GNOMON_TARGET_WIDE void gemm_rows_wide(const Gemm& g, int64_t n_begin, int64_t n_end) {
  gemm_rows(g, WideTiles{}, n_begin, n_end);
}
#endif

// ---- GEMM with bfloat16 activations on AVX512-BF16 ---------------------------------------------
//
// E2M1 values are exact in bf16, so with bf16 activations vdpbf16ps computes the products exactly
// and accumulates them in float32, 32 per instruction instead of 16. A group is again 64 bytes
// (4 blocks), now read as 32 16-bit lanes: lane l holds the codes of elements 4l..4l+3, and
// shifting by 4q brings element 4l + q into the low nibble, which vpermw maps to its bf16 value
// (through a 32-entry table, entries 16-31 repeating 0-15 for the stray fifth index bit).
// vdpbf16ps sums lanes 2i and 2i+1 (elements 8i + q and 8i + 4 + q) into float lane i, which
// belongs to block i/4; the block scales then multiply the group's sum in float32. The
// instruction treats bf16 subnormal activations (below 2^-126) as zero.
#if GNOMON_HAS_WIDE_KERNELS

// Eight activation rows a tile, two weight rows: each weight group is decoded once for all of
// M = 8 (with four rows it was decoded twice; 0.90x the time at M = 8, AVX512-BF16 family).
constexpr int kBf16TileRows = 8;

struct Bf16Tiles {
  static constexpr int kMaxMT = kBf16TileRows, kNT = 2, kLanes = 16;
  static constexpr int64_t kGroup = 128, kActivationBytes = 2;
  uint16_t table[32];

  Bf16Tiles() {
    for (int i = 0; i < 32; ++i) table[i] = math::float_to_bf16(math::e2m1_to_float(i % 16));
  }

  // A group's 64 bytes to bf16 weights: weights[q] lane l = element 4l + q.
  GNOMON_TARGET_BF16 GNOMON_INLINE static void decode(__m512i lut, const uint8_t* bytes,
                                                     __m512bh* weights) {
    const __m512i words = _mm512_loadu_si512(bytes);
    weights[0] = (__m512bh)_mm512_permutexvar_epi16(words, lut);
    weights[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 4), lut);
    weights[2] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 8), lut);
    weights[3] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, 12), lut);
  }

  template <int MT, int NT>
  GNOMON_TARGET_BF16 void tile(const Gemm& g, int64_t m0, int64_t n0, float* res,
                               int64_t res_stride) const {
    const TileRows<NT, 64> rows(g, n0);
    const __m512i lut = _mm512_loadu_si512(table);
    __m512 acc[MT][NT];
    for (int m = 0; m < MT; ++m) {
      for (int r = 0; r < NT; ++r) acc[m][r] = _mm512_setzero_ps();
    }
    const uint16_t* a_rows = static_cast<const uint16_t*>(g.a) + g.a_offset(m0, kGroup);
    for (int64_t grp = 0; grp < g.k_padded / kGroup; ++grp) {
      rows.prefetch_next(grp);
      const uint16_t* a_group = a_rows + grp * kMaxMT * kGroup;
      // One weight row at a time: its group decoded to bf16, applied to every activation row
      // (the sums of unscaled products, exact in bf16, times the block scales in float32), and
      // done with before the next row is decoded. Fully unrolled, so that the MT x NT = 16
      // accumulators stay in registers.
#pragma GCC unroll 4
      for (int r = 0; r < NT; ++r) {
        __m512bh weights[4];
        decode(lut, rows.bytes(r, grp), weights);
        const __m512 scale = bit_cast<__m512>(group_scales<Wide>(rows.scale_word(r, grp)));
        const uint16_t* x = a_group;
        asm("" : "+r"(x));
#pragma GCC unroll 16
        for (int m = 0; m < MT; ++m, x += kGroup) {
          // two chains of two products, not one of four: 0.96x the time at M = 8
          __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) {
            sum[q / 2] = _mm512_dpbf16_ps(sum[q / 2], weights[q],
                                          (__m512bh)_mm512_loadu_si512(x + 32 * q));
          }
          acc[m][r] = _mm512_fmadd_ps(_mm512_add_ps(sum[0], sum[1]), scale, acc[m][r]);
        }
      }
    }
    for (int m = 0; m < MT; ++m) {
      for (int r = 0; r < NT; ++r) res[m * res_stride + r] = _mm512_reduce_add_ps(acc[m][r]);
    }
  }

  // Row `src` (K bf16) into the group order, zero-padded to k_padded, group i at
  // dst + i * kMaxMT * kGroup: dst[q*32 + l] of a group = src[g0 + 4l + q].
  static void permute_row(const uint16_t* src, int64_t k, int64_t k_padded, uint16_t* dst) {
    for (int64_t g0 = 0; g0 < k_padded; g0 += kGroup, dst += kMaxMT * kGroup) {
      for (int q = 0; q < 4; ++q) {
        for (int l = 0; l < 32; ++l) {
          const int64_t e = g0 + 4 * l + q;
          dst[32 * q + l] = e < k ? src[e] : 0;
        }
      }
    }
  }
};


#endif

// ---- many bf16 activation rows on AVX512-BF16 or AMX: the rows in the lanes -----------------
//
// The tiles above decode each weight group once per kMaxMT activation rows. With M of 32 or more
// rows (4 or more on AMX) the weights are instead decoded once into bf16 panels of kLanesRows rows
// (kAmxLanesRows on AMX; weight_rows.h) and meet every activation row at once, transposed into
// bf16 pairs [K/2][lanes]. The scale is folded into the bf16 weights, which is exact while
// E2M1 x 2^(s - 127) is a normal bf16, i.e. for scale bytes 2..252: a call with any other scale
// byte runs the tiles, which apply the scales in float32 after the exact sums.
#if GNOMON_HAS_WIDE_KERNELS
constexpr int64_t kLanesMinRows = 32;  // two whole vectors; at 16 the tiles are faster
// At 1 and 2 rows the bf16 dot-product tiles measured 0.4-0.8x the AMX time (decode-bound with
// mostly empty tiles), from 4 rows 0.4-1.3x slower.
constexpr int64_t kAmxMinRows = 4;
constexpr int64_t kLanesSlice = 64;  // output columns gathered per store

GNOMON_TARGET_BF16 void mxfp4_lanes_bf16(const void* const* rows, const uint8_t* const* scales,
                                         int nr, const void* b, int64_t lanes, int64_t k,
                                         void* panel, float* c) {
  lanes_rows<Wide, Mxfp4Rows<Wide>, true>(rows, scales, nr, b, lanes, k, panel, c);
}

// Whether every byte is in 2..252, in one vectorised pass (no early exit).
GNOMON_SIMD_CLONES bool all_scales_fold(const uint8_t* s, int64_t n) {
  uint8_t outside = 0;
  for (int64_t i = 0; i < n; ++i) outside |= static_cast<uint8_t>(s[i] - 2) > 250;
  return outside == 0;
}

bool scales_fold_exactly(const TensorView& w_scales) {
  return all_scales_fold(w_scales.ptr<const uint8_t>(), w_scales.numel());
}

void gemm_lanes(const TensorView& out, const TensorView& a, const TensorView& w,
                const TensorView& w_scales, const float* bias, bool amx) {
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0), words = k / 2;
  const int64_t lanes = (m + 15) / 16 * 16, elem = dtype_size(out.dtype);
  const int64_t depth = amx ? amx_depth(k) : words, panel_rows = amx ? kAmxLanesRows : kLanesRows;
  auto* const kernel = amx ? lanes_rows_amx<Mxfp4Rows<Wide>> : mxfp4_lanes_bf16;
  AlignedVector<uint32_t> b(static_cast<size_t>(depth * lanes));  // zeros in the padding
  // words is a multiple of 16 (K of whole MXFP4 blocks), as the wide transpose reads rows
  transpose_words(Isa::Wide, a.data, m, words, words, b.data(), lanes);
  // Slices of kLanesSlice columns, handed out one at a time (ItemQueue): with parallel_for's four
  // chunks a thread, one thread waited out the other's last chunk (M=8 on 2 threads: 0.955x)
  ItemQueue slices((n + kLanesSlice - 1) / kLanesSlice);
  parallel_for(slices.tickets(), 1, [&](int64_t ticket, int64_t) {
    // uninitialised: the decoders write every word the products read
    const AlignedArray<uint32_t> panel =
        make_aligned<uint32_t>(amx ? amx_panel_words(k) : panel_rows * depth);
    AlignedVector<float> c(panel_rows * lanes);
    std::vector<float> res(static_cast<size_t>(m * kLanesSlice));
    for (int64_t slice; slices.take(ticket, slice);) {
      const int64_t s0 = slice * kLanesSlice, width = std::min(kLanesSlice, n - s0);
      for (int64_t n0 = s0; n0 < s0 + width; n0 += panel_rows) {
        const int nr = static_cast<int>(std::min(panel_rows, s0 + width - n0));
        const void* rows[kAmxLanesRows];
        const uint8_t* scales[kAmxLanesRows];
        for (int r = 0; r < nr; ++r) {
          rows[r] = w.ptr<const uint8_t>() + (n0 + r) * words;
          scales[r] = w_scales.ptr<const uint8_t>() + (n0 + r) * (k / kMxfp4BlockSize);
        }
        kernel(rows, scales, nr, b.data(), lanes, k, panel.get(), c.data());
        for (int r = 0; r < nr; ++r) {
          const float add = bias != nullptr ? bias[n0 + r] : 0.0f;
          for (int64_t t = 0; t < m; ++t) res[t * kLanesSlice + n0 - s0 + r] = c[r * lanes + t] + add;
        }
      }
      for (int64_t t = 0; t < m; ++t) {
        store_floats(res.data() + t * kLanesSlice, out.dtype,
                     static_cast<char*>(out.data) + (t * n + s0) * elem, width);
      }
    }
  });
}
#endif

// Rows of a quantize/dequantize call are handled in pieces of this many blocks.
constexpr int64_t kPieceBlocks = 256;

const char* byte_ptr(const TensorView& t, int64_t elements) {
  return static_cast<const char*>(t.data) + elements * dtype_size(t.dtype);
}

}  // namespace

void mxfp4_quantize(const TensorView& packed, const TensorView& scales, const TensorView& x,
                    ScaleRule scale_rule) {
  const int64_t blocks = x.numel() / kMxfp4BlockSize;
  parallel_for(blocks, kPieceBlocks, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(x.dtype == DType::Float32 ? 0 : kPieceBlocks * kMxfp4BlockSize);
    for (int64_t b0 = begin; b0 < end; b0 += kPieceBlocks) {
      const int64_t count = std::min(kPieceBlocks, end - b0);
      const float* values;
      if (x.dtype == DType::Float32) {
        values = x.ptr<const float>() + b0 * kMxfp4BlockSize;
      } else {
        load_floats(byte_ptr(x, b0 * kMxfp4BlockSize), x.dtype, buffer.data(),
                    count * kMxfp4BlockSize);
        values = buffer.data();
      }
      quantize_blocks(values, packed.ptr<uint8_t>() + b0 * kBlockBytes,
                      scales.ptr<uint8_t>() + b0, count, scale_rule);
    }
  });
}

void mxfp4_dequantize(const TensorView& out, const TensorView& packed, const TensorView& scales) {
  const int64_t blocks = out.numel() / kMxfp4BlockSize;
  parallel_for(blocks, kPieceBlocks, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(out.dtype == DType::Float32 ? 0 : kPieceBlocks * kMxfp4BlockSize);
    for (int64_t b0 = begin; b0 < end; b0 += kPieceBlocks) {
      const int64_t count = std::min(kPieceBlocks, end - b0);
      const uint8_t* bytes = packed.ptr<const uint8_t>() + b0 * kBlockBytes;
      const uint8_t* block_scales = scales.ptr<const uint8_t>() + b0;
      if (out.dtype == DType::Float32) {
        dequantize_blocks(bytes, block_scales, out.ptr<float>() + b0 * kMxfp4BlockSize, count);
      } else {
        dequantize_blocks(bytes, block_scales, buffer.data(), count);
        char* dst = static_cast<char*>(out.data) + b0 * kMxfp4BlockSize * dtype_size(out.dtype);
        store_floats(buffer.data(), out.dtype, dst, count * kMxfp4BlockSize);
      }
    }
  });
}

namespace {

// The tiles one call runs: 8-lane float32, 16-lane float32, or bf16 dot products.
enum class GemmTiles { Narrow, Wide, Bf16 };

template <typename Tiles>
void permute_rows(const Gemm& g, const TensorView& a, void* dst, int64_t begin, int64_t end) {
  using Element = std::conditional_t<Tiles::kActivationBytes == 2, uint16_t, float>;
  std::vector<float> row(Tiles::kActivationBytes == 2 ? 0 : static_cast<size_t>(g.k));
  for (int64_t i = begin; i < end; ++i) {
    Element* out = static_cast<Element*>(dst) + g.a_offset(i, Tiles::kGroup);
    if constexpr (Tiles::kActivationBytes == 2) {
      Tiles::permute_row(a.ptr<const uint16_t>() + i * g.k, g.k, g.k_padded, out);
    } else {
      load_floats(byte_ptr(a, i * g.k), a.dtype, row.data(), g.k);
      Tiles::permute_row(row.data(), g.k, g.k_padded, out);
    }
  }
}

}  // namespace

void mxfp4_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                const TensorView& w_scales, const TensorView* bias) {
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0);
  if (m == 0 || n == 0) return;
  const Isa isa = kernel_isa();
  GemmTiles tiles = isa == Isa::Narrow ? GemmTiles::Narrow : GemmTiles::Wide;
  if (has_bf16_dot(isa) && a.dtype == DType::BFloat16) tiles = GemmTiles::Bf16;
  const int64_t group = tiles == GemmTiles::Narrow ? NarrowTiles::kGroup : 128;
  const int64_t k_padded = (k + group - 1) / group * group;
  // activation rows per tile: the permuted activations come in blocks of this many rows
  const int64_t row_block = tiles == GemmTiles::Narrow ? NarrowTiles::kMaxMT
                            : tiles == GemmTiles::Wide ? WideTiles::kMaxMT
                                                       : kBf16TileRows;
  const int64_t rows = (m + row_block - 1) / row_block * row_block;
  const bool bf16 = tiles == GemmTiles::Bf16;
  std::vector<float> bias_values;
  if (bias != nullptr) {
    bias_values.resize(static_cast<size_t>(n));
    load_floats(bias->data, bias->dtype, bias_values.data(), n);
  }
#if GNOMON_HAS_WIDE_KERNELS
  const bool amx = bf16 && isa == Isa::Amx;
  if (bf16 && m >= (amx ? kAmxMinRows : kLanesMinRows) && scales_fold_exactly(w_scales)) {
    return gemm_lanes(out, a, w, w_scales, bias != nullptr ? bias_values.data() : nullptr, amx);
  }
#endif
  // The activations, once, in the order and layout the inner loop reads them (zero-filled, so
  // the padding rows of the last block read as zeros)
  std::vector<float> a_float(bf16 ? 0 : static_cast<size_t>(rows * k_padded));
  std::vector<uint16_t> a_bf16(bf16 ? static_cast<size_t>(rows * k_padded) : 0);
  void* a_data = bf16 ? static_cast<void*>(a_bf16.data()) : a_float.data();
  const Gemm g{w.ptr<const uint8_t>(), w_scales.ptr<const uint8_t>(), a_data,
               bias != nullptr ? bias_values.data() : nullptr, out.data, out.dtype, m, n, k,
               k_padded, row_block};
  parallel_for(m, 16, [&](int64_t begin, int64_t end) {
    switch (tiles) {
      case GemmTiles::Narrow: return permute_rows<NarrowTiles>(g, a, a_data, begin, end);
      case GemmTiles::Wide: return permute_rows<WideTiles>(g, a, a_data, begin, end);
#if GNOMON_HAS_WIDE_KERNELS
      case GemmTiles::Bf16: return permute_rows<Bf16Tiles>(g, a, a_data, begin, end);
#endif
      default: return;
    }
  });
  // Parallel over weight rows; each piece holds at least 16 rows.
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    switch (tiles) {
      case GemmTiles::Narrow: return gemm_rows_narrow(g, begin, end);
#if GNOMON_HAS_WIDE_KERNELS
      case GemmTiles::Wide: return gemm_rows_wide(g, begin, end);
      case GemmTiles::Bf16: return gemm_rows(g, Bf16Tiles{}, begin, end);
#endif
      default: return;
    }
  });
}

}  // namespace gnomon::cpu
