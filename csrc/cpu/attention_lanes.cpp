// The kernels of attention_lanes.h, on vectors (vec.h) and AMX tiles (lanes_gemm.h).
#include <algorithm>
#include <cstring>

#include "core/errors.h"
#include "cpu/attention_lanes.h"
#include "cpu/lanes_gemm.h"

namespace gnomon::cpu {
namespace {

// The online softmax of one key tile in lanes, on S^T in tile.scores (rows past n unread): masks,
// scales and exponentiates into P^T (in place, or with kDot rounded to bf16 and paired by keys
// in tile.p_pairs, the exponentials then only as exact as bf16 needs), updates each row's max
// and sum and leaves its rescale of O^T in tile.alpha.
// A row's max moves only when the tile's exceeds it by more than kMaxSlack: P then stays below
// 2^8 (far from any overflow, in fp32 and in bf16), and most tiles after the first leave every
// alpha at exactly 1, so the pass that rescales O^T is skipped.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kMaxSlack = 8.0f / kLog2e;  // 2^8 in p

template <typename V, bool kDot>
GNOMON_INLINE void lanes_softmax(const LanesHead& head, const LanesTile& tile) {
  using F = typename V::F;
  using I = typename V::I;
  const int64_t lanes = head.lanes, ld = head.ld;
  const F neg_inf = F{} + kNegInf;
  const float scale2 = tile.scale * kLog2e;  // p = 2^(s scale2 - max log2(e))
  for (int64_t lane = 0; lane < lanes; lane += V::L) {
    F block_max = neg_inf;
    if (tile.masked) {  // on the diagonal or the window's edge: -inf outside each row's range
      const I lo = load<I>(tile.lo + lane), hi = load<I>(tile.hi + lane);
      for (int32_t j = 0; j < tile.n; ++j) {
        float* row = tile.scores + j * ld + lane;
        const F s = select((lo <= j) & (j < hi), load<F>(row), neg_inf);
        store(row, s);
        block_max = max(block_max, s * tile.scale);
      }
    } else {  // four independent chains of max, not one
      auto scaled = [&](int64_t j) { return load<F>(tile.scores + j * ld + lane) * tile.scale; };
      F part[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
      int64_t j = 0;
      for (; j + 4 <= tile.n; j += 4) {
        for (int u = 0; u < 4; ++u) part[u] = max(part[u], scaled(j + u));
      }
      for (; j < tile.n; ++j) part[0] = max(part[0], scaled(j));
      block_max = max(max(part[0], part[1]), max(part[2], part[3]));
    }
    const F old_max = load<F>(head.max + lane);
    const F new_max = select(block_max > old_max + kMaxSlack, block_max, old_max);
    const F shift = select(new_max == neg_inf, F{}, new_max);  // all -inf so far: p = 0, not NaN
    // exactly 1 where the max stayed (a difference, not a fused multiply-add, so no rounding)
    const F alpha = exp2_below_128<V>((old_max - shift) * kLog2e);
    const F shift2 = shift * kLog2e;
    auto p = [&](int64_t j) {
      return exp2_below_128<V, kDot>(load<F>(tile.scores + j * ld + lane) * scale2 - shift2);
    };
    F total = F{};
    if constexpr (kDot) {
      // P^T rounded to bf16 and paired by keys, as V's rows are (the pair past an odd n is 0)
      for (int64_t q = 0; 2 * q < tile.n; ++q) {
        const F even = p(2 * q), odd = 2 * q + 1 < tile.n ? p(2 * q + 1) : F{};
        total += even + odd;
        store(tile.p_pairs + q * ld + lane, bf16_pairs<V>(even, odd));
      }
    } else {
      for (int64_t j = 0; j < tile.n; ++j) {
        const F pj = p(j);
        store(tile.scores + j * ld + lane, pj);
        total += pj;
      }
    }
    store(head.max + lane, new_max);
    store(head.sum + lane, load<F>(head.sum + lane) * alpha + total);
    store(tile.alpha + lane, alpha);
  }
}

// One key tile of one KV head: scores, the online softmax in lanes, and the value update, in
// register blocks of NI x RV vectors.
template <typename V, bool kDot, int RV, int NI>
GNOMON_INLINE void lanes_tile(const LanesHead& head, const LanesTile& tile) {
  const int64_t lanes = head.lanes, ld = head.ld, d = tile.d;
  // S^T[j][r] = sum over head dims of K[j][e] Q^T[e][r]
  lanes_gemm<V, kDot, RV, NI>(tile.n, tile.keys, kDot ? d / 2 : d, 1, kDot ? d / 2 : d, head.qt,
                              tile.scores, lanes, ld, nullptr);
  lanes_softmax<V, kDot>(head, tile);
  if constexpr (kDot) {
    // O^T[e][r] = alpha[r] O^T[e][r] + sum over key pairs of V2[q][e] . P2^T[q][r]
    lanes_gemm<V, kDot, RV, NI>(d, tile.values, 1, d, (tile.n + 1) / 2, tile.p_pairs, head.ot,
                                lanes, ld, tile.alpha);
  } else {
    lanes_gemm<V, kDot, RV, NI>(d, tile.values, 1, d, tile.n, tile.scores, head.ot, lanes, ld,
                                tile.alpha);
  }
}

GNOMON_SIMD_CLONES void lanes_tile_narrow(const LanesHead& head, const LanesTile& tile) {
  lanes_tile<Narrow, false, 2, 6>(head, tile);  // 12 accumulators of 16 registers
}
#if GNOMON_HAS_WIDE_KERNELS
GNOMON_TARGET_WIDE void lanes_tile_wide(const LanesHead& head, const LanesTile& tile) {
  lanes_tile<Wide, false, 4, 6>(head, tile);  // 24 accumulators of 32 registers
}
GNOMON_TARGET_BF16 void lanes_tile_bf16(const LanesHead& head, const LanesTile& tile) {
  lanes_tile<Wide, true, 4, 6>(head, tile);
}

// ---- the same on AMX tiles (head dims a multiple of 32) ----------------------------------------
//
// S^T = K Q^T takes the dense key tile as A; O^T = alpha O^T + V^T P^T takes the values
// transposed into pairs of keys per head dim (tile.values: [d][kLanesKeys / 2] words, zero past
// n), so both products run as tile products; the softmax between them stays in the vector lanes.

// Value rows (bf16, d each; row n and later read as zeros) as pairs of keys per head dim:
// out[e][q] = rows[2q][e] | rows[2q + 1][e] << 16 for q < kLanesKeys / 2.
GNOMON_TARGET_AMX void pair_columns_bf16(const uint16_t* const* rows, int64_t n, int64_t d,
                                         uint32_t* out) {
  constexpr int64_t Q = kLanesKeys / 2;
  for (int64_t q0 = 0; q0 < Q; q0 += 16) {
    for (int64_t e0 = 0; e0 < d; e0 += 16) {
      Wide::U m[16];
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t k = 2 * (q0 + i);
        const Wide::U even = k < n ? widen<Wide>(rows[k] + e0) : Wide::U{};
        const Wide::U odd = k + 1 < n ? widen<Wide>(rows[k + 1] + e0) : Wide::U{};
        m[i] = even | (odd << 16);
      }
      transpose16(m);
      for (int64_t i = 0; i < 16; ++i) store(out + (e0 + i) * Q + q0, m[i]);
    }
  }
}

GNOMON_TARGET_AMX void lanes_tile_amx(const LanesHead& head, const LanesTile& tile) {
  const int64_t lanes = head.lanes, ld = head.ld, d = tile.d;
  const int64_t key_rows = (tile.n + kAmxRows - 1) / kAmxRows * kAmxRows;
  const int64_t key_pairs = ((tile.n + 1) / 2 + kAmxPairs - 1) / kAmxPairs * kAmxPairs;
  auto nothing = [](int64_t, int64_t) {};
  amx_begin();
  amx_gemm(key_rows, static_cast<const uint32_t*>(tile.keys), d / 2,
           reinterpret_cast<const uint32_t*>(head.qt), lanes, ld, d / 2, tile.scores, false,
           nothing);
  lanes_softmax<Wide, true>(head, tile);
  for (int64_t lane = 0; lane < lanes; lane += Wide::L) {
    const Wide::F alpha = load<Wide::F>(tile.alpha + lane);
    const Wide::I unchanged = alpha == 1.0f;
    bool all = true;
    for (int i = 0; i < Wide::L; ++i) all = all && unchanged[i] != 0;
    if (all) continue;  // no row's max moved
    for (int64_t e = 0; e < d; ++e) {
      float* o = head.ot + e * ld + lane;
      store(o, load<Wide::F>(o) * alpha);
    }
  }
  // pairs past n: zero values against P pairs of earlier tiles (finite)
  amx_gemm(d, static_cast<const uint32_t*>(tile.values), kLanesKeys / 2, tile.p_pairs, lanes, ld,
           key_pairs, head.ot, true, nothing);
  amx_end();
}

// Rows 2q and 2q + 1 of `rows` (bf16, d each; row n and later read as zeros) as 32-bit pairs:
// out[q][e] = rows[2q][e] | rows[2q + 1][e] << 16.
GNOMON_TARGET_BF16 void pair_rows_bf16(const uint16_t* const* rows, int64_t n, int64_t d,
                                       uint32_t* out) {
  typedef uint16_t u16x32 __attribute__((vector_size(64)));
  const u16x32 low = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                      8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const u16x32 high = low + 16;
  for (int64_t q = 0; 2 * q < n; ++q) {
    const uint16_t* even = rows[2 * q];
    const uint16_t* odd = 2 * q + 1 < n ? rows[2 * q + 1] : nullptr;
    uint32_t* dst = out + q * d;
    int64_t e = 0;
    for (; odd != nullptr && e + 32 <= d; e += 32) {
      const u16x32 a = load<u16x32>(even + e), b = load<u16x32>(odd + e);
      store(dst + e, __builtin_shuffle(a, b, low));
      store(dst + e + 16, __builtin_shuffle(a, b, high));
    }
    for (; e < d; ++e) dst[e] = even[e] | (odd != nullptr ? uint32_t{odd[e]} << 16 : 0u);
  }
}
#endif

}  // namespace

void run_lanes_tile(Isa isa, bool amx_dot, bool dot, const LanesHead& head,
                    const LanesTile& tile) {
  switch (isa) {
#if GNOMON_HAS_WIDE_KERNELS
    case Isa::Amx:
      if (amx_dot) return lanes_tile_amx(head, tile);
      [[fallthrough]];
    case Isa::WideBf16:
      if (dot) return lanes_tile_bf16(head, tile);
      [[fallthrough]];
    case Isa::Wide: return lanes_tile_wide(head, tile);
#endif
    default: return lanes_tile_narrow(head, tile);
  }
}

void pair_values(Isa isa, bool amx_dot, const uint16_t* const* rows, int64_t n, int64_t d,
                 void* out) {
#if GNOMON_HAS_WIDE_KERNELS
  auto* words = static_cast<uint32_t*>(out);
  if (isa == Isa::Amx && amx_dot) return pair_columns_bf16(rows, n, d, words);
  if (has_bf16_dot(isa)) return pair_rows_bf16(rows, n, d, words);
#endif
  raise<ValueError>("pair_values: the ", isa_name(isa), " kernels have no bf16 dot products");
}

}  // namespace gnomon::cpu
