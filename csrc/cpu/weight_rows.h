#pragma once
// Expert and GEMM weight rows, by dtype, for the CPU kernels that stream weights (fused_moe,
// mxfp4_gemm), and the tokens-in-lanes product of a block of decoded rows (lanes_gemm.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/scalar_math.h"
#include "cpu/lanes_gemm.h"
#include "cpu/vec.h"

namespace gnomon::cpu {

// A weight kind decodes a step of its row into float vectors. float32 and float16 rows give L
// consecutive elements per step; bf16 and MXFP4 rows give 2L, as their even and odd elements
// separately (a 32-bit word holds two bf16 values, a byte two E2M1 codes), so the activations
// they meet are stored "split": every group of G = 2L elements holds its even elements, then
// its odd ones (the Layout in moe.cpp). Dense rows meet activations as they are.

struct E8M0Table {
  float value[256];
  E8M0Table() {
    for (int i = 0; i < 256; ++i) value[i] = math::e8m0_to_float(static_cast<uint8_t>(i));
  }
};
inline const E8M0Table kE8M0;

// The bf16 bits of E2M1 code i times 2^(s - 127), for every scale byte s: exact for s in 2..252;
// below, bf16 subnormals (which the dot products read as zero), above, infinities as in float32,
// and NaN for 0xFF. Entries i and i + 16 are alike, so that a 32-entry word permute (vpermw)
// may ignore the fifth bit of its indices.
struct Bf16E2M1Tables {
  alignas(64) uint16_t value[256][32];
  Bf16E2M1Tables() {
    for (int s = 0; s < 256; ++s) {
      for (int i = 0; i < 32; ++i) {
        const float v = math::e2m1_to_float(static_cast<uint8_t>(i % 16)) *
                        math::e8m0_to_float(static_cast<uint8_t>(s));
        value[s][i] = static_cast<uint16_t>(math::float_to_bits(v) >> 16);
      }
    }
  }
};
inline const Bf16E2M1Tables kBf16E2M1;

template <typename V>
struct F32Rows {
  static constexpr int kVectors = 1;
  static constexpr int64_t kSplit = 0;
  static int64_t offset(int64_t k) { return 4 * k; }
  static GNOMON_INLINE void decode(const void* row, const uint8_t*, int64_t k, typename V::F* w) {
    w[0] = load<typename V::F>(static_cast<const float*>(row) + k);
  }
  static float at(const void* row, int64_t j) { return static_cast<const float*>(row)[j]; }
};

template <typename V>
struct F16Rows {
  static constexpr int kVectors = 1;
  static constexpr int64_t kSplit = 0;
  static int64_t offset(int64_t k) { return 2 * k; }
  static GNOMON_INLINE void decode(const void* row, const uint8_t*, int64_t k, typename V::F* w) {
    w[0] = half_to_float<V>(widen<V>(static_cast<const uint16_t*>(row) + k));
  }
  static float at(const void* row, int64_t j) {
    return math::fp16_to_float(static_cast<const uint16_t*>(row)[j]);
  }
};

// bf16 pairs: the low half of each 32-bit word (shifted up) is the even element, the high half
// (masked) the odd one.
template <typename V>
struct BF16Rows {
  static constexpr int kVectors = 2;
  static constexpr int64_t kSplit = 2 * V::L;
  static int64_t offset(int64_t k) { return 2 * k; }
  static GNOMON_INLINE void decode(const void* row, const uint8_t*, int64_t k, typename V::F* w) {
    const auto pairs = load<typename V::U>(static_cast<const uint16_t*>(row) + k);
    w[0] = bit_cast<typename V::F>(pairs << 16);
    w[1] = bit_cast<typename V::F>(pairs & 0xffff0000u);
  }
  static float at(const void* row, int64_t j) {
    return math::bf16_to_float(static_cast<const uint16_t*>(row)[j]);
  }
};

// MXFP4 rows (K/2 packed bytes, K/32 E8M0 scales; K % 32 == 0): a step's L bytes hold 2L codes,
// the low nibbles the even elements and the high nibbles the odd ones, all of one block; its
// scale multiplies the code table, and a permute looks the codes up.
template <typename V>
struct Mxfp4Rows {
  static constexpr int kVectors = 2;
  static constexpr int64_t kSplit = 2 * V::L;
  static int64_t offset(int64_t k) { return k / 2; }
  static GNOMON_INLINE void decode(const void* row, const uint8_t* scales, int64_t k,
                                   typename V::F* w) {
    const typename V::U codes = widen<V>(static_cast<const uint8_t*>(row) + k / 2);
    const typename V::F table = e2m1_table<V>() * kE8M0.value[scales[k / 32]];
    w[0] = decode_nibbles<V>(table, codes, 0);
    w[1] = decode_nibbles<V>(table, codes, 4);
  }
  static float at(const void*, int64_t) { return 0.0f; }  // K % 32 == 0: no tail
};

// ---- tokens in the lanes ---------------------------------------------------------------------

constexpr int kLanesRows = 8;     // weight rows decoded into one panel by the vector GEMMs
constexpr int kAmxLanesRows = 32;  // ... and by the AMX one: two A tiles (with B, C and the next chunk, in L1)

constexpr int64_t kPrefetchBytes = 256;  // how far ahead of its decode a row is fetched

// `blocks` MXFP4 blocks (16 bytes, one scale each) as 16 bf16 pairs each. A block's bytes widen
// to 16 words; (word | word << 12) holds the low nibble's code in its low half and the high
// nibble's in its high half, and one word permute (vpermw, through the block scale's table)
// turns both halves into the pair. With `fetch_ahead` the row is fetched kPrefetchBytes ahead,
// once per 32 bytes (every line however the row is aligned): callers decode many rows a chunk at
// a time, more streams than the hardware prefetchers follow. Wide (AVX-512) callers only.
GNOMON_INLINE void decode_mxfp4_pairs(const uint8_t* bytes, const uint8_t* scales, int64_t blocks,
                                      uint32_t* out, bool fetch_ahead) {
  typedef uint16_t Words __attribute__((vector_size(64)));
  for (int64_t i = 0; i < blocks; ++i) {
    if (fetch_ahead && i % 2 == 0) __builtin_prefetch(bytes + 16 * i + kPrefetchBytes);
    const Wide::U codes = widen<Wide>(bytes + 16 * i);
    const Words index = bit_cast<Words>(codes | (codes << 12));
    Words pairs;
#if defined(__x86_64__)
    // vpermw with the table in memory (GCC's shuffle picks the three-uop vpermi2w)
    asm("vpermw %1, %2, %0" : "=v"(pairs) : "m"(kBf16E2M1.value[scales[i]]), "v"(index));
#else
    pairs = __builtin_shuffle(load<Words>(kBf16E2M1.value[scales[i]]), index);
#endif
    store(out + 16 * i, pairs);
  }
}

// Elements [k0, k1) of a bf16 or MXFP4 row of K elements as bf16 pairs (k0 even; for MXFP4 a
// multiple of 32, and V Wide), zeros past K.
template <typename V, typename Rows>
GNOMON_INLINE void decode_pairs(const void* row, const uint8_t* scales, int64_t K, int64_t k0,
                                int64_t k1, uint32_t* out) {
  const int64_t end = std::max(k0, std::min(k1, K));
  if constexpr (std::is_same_v<Rows, Mxfp4Rows<V>>) {
    static_assert(V::L == 16);
    decode_mxfp4_pairs(static_cast<const uint8_t*>(row) + k0 / 2, scales + k0 / 32,
                       (end - k0) / 32, out, true);
  } else {  // bf16 rows are bf16 pairs already
    const char* next = static_cast<const char*>(row) + 2 * end + kPrefetchBytes;
    for (int64_t line = 0; line < 2 * (end - k0); line += 64) __builtin_prefetch(next - line);
    std::memcpy(out, static_cast<const uint16_t*>(row) + k0, (end - k0) * sizeof(uint16_t));
    if (end % 2 == 1) reinterpret_cast<uint16_t*>(out)[end - k0] = 0;
  }
  const int64_t used = (end - k0 + 1) / 2, words = (k1 - k0) / 2;
  if (used < words) std::memset(out + used, 0, (words - used) * sizeof(uint32_t));
}

// Row `row`'s K elements into `panel`: floats in the split order of Rows (its decode), or, with
// kDot, bf16 pairs in natural order with a zero after an odd K.
template <typename V, typename Rows, bool kDot>
GNOMON_INLINE void decode_row(const void* row, const uint8_t* scales, int64_t K, void* panel) {
  constexpr int W = Rows::kVectors;
  constexpr int64_t step = W * V::L;
  if constexpr (!kDot) {
    float* out = static_cast<float*>(panel);
    int64_t k = 0;
    for (; k + step <= K; k += step) {
      typename V::F w[W];
      Rows::decode(row, scales, k, w);
      for (int i = 0; i < W; ++i) store(out + k + i * V::L, w[i]);
    }
    for (; k < K; ++k) out[k] = Rows::at(row, k);
  } else {
    decode_pairs<V, Rows>(row, scales, K, 0, K + K % 2, static_cast<uint32_t*>(panel));
  }
}

// c[r][lane] = dot(row r, B[.][lane]) for nr <= kLanesRows rows and `lanes` lanes.
template <typename V, typename Rows, bool kDot>
GNOMON_INLINE void lanes_rows(const void* const* rows, const uint8_t* const* scales, int nr,
                              const void* b, int64_t lanes, int64_t K, void* panel, float* c) {
  const int64_t depth = kDot ? (K + 1) / 2 : K;  // words of a panel row on the dot path
  for (int r = 0; r < nr; ++r) {
    decode_row<V, Rows, kDot>(rows[r], scales[r], K,
                              static_cast<char*>(panel) + r * depth * sizeof(float));
  }
  // Wide: 8 rows x 2 vectors, 16 of 32 registers; Narrow: 4 x 2, 8 of 16.
  constexpr int NI = V::L == 16 ? kLanesRows : kLanesRows / 2;
  lanes_gemm<V, kDot, 2, NI>(nr, panel, depth, 1, depth, b, c, lanes, lanes, nullptr);
}

}  // namespace gnomon::cpu

#if GNOMON_HAS_WIDE_KERNELS
namespace gnomon::cpu {

// The same on AMX tiles for bf16 or MXFP4 rows (bf16 pairs), nr <= kAmxLanesRows: B's depth is
// (K + 1) / 2 rounded up to whole tiles of kAmxPairs, its padding rows zero; the panel holds
// amx_panel_words(K) words, and c whole tiles of rows.
inline int64_t amx_depth(int64_t K) { return ((K + 1) / 2 + kAmxPairs - 1) / kAmxPairs * kAmxPairs; }

constexpr int64_t kAmxChunk = 64;  // pairs decoded at a time, between tile products

// The panel: the rows decoded whole, a chunk of kAmxChunk pairs after another (a chunk's rows
// `pairs` words apart).
inline int64_t amx_panel_words(int64_t K) {
  return kAmxLanesRows * ((amx_depth(K) + kAmxChunk - 1) / kAmxChunk * kAmxChunk);
}

// Rows [r0, r1) of chunk `index` (kAmxChunk pairs, fewer in the last) as bf16 pairs into the
// panel, rows past nr zero. The callers' next panel is mostly the nr rows after these.
template <typename Rows>
struct AmxChunkDecoder {
  const void* const* rows;
  const uint8_t* const* scales;
  int nr;
  int64_t K, depth;
  uint32_t* panel;
  // chunk slots: two where one block of lanes reads each chunk once (then they stay in L1), else
  // one per chunk, which the later blocks read again
  int64_t slots;

  uint32_t* chunk(int64_t index) const {
    return panel + index % slots * kAmxLanesRows * kAmxChunk;
  }

  GNOMON_TARGET_AMX void operator()(int64_t index, int64_t r0, int64_t r1) const {
    const int64_t p0 = index * kAmxChunk, pairs = std::min(kAmxChunk, depth - p0);
    const int64_t next_panel = nr * K / 2;
    uint32_t* const out = chunk(index);
    for (int64_t r = r0; r < r1; ++r) {
      uint32_t* row = out + r * pairs;
      if (r >= nr) {
        std::memset(row, 0, pairs * sizeof(uint32_t));
      } else if constexpr (std::is_same_v<Rows, Mxfp4Rows<Wide>>) {
        // K % 32 == 0: depth is K / 2 and a chunk whole blocks, so the bare loop (measured
        // ~1.3x faster at 16 lanes than through decode_pairs' bounds). The decode fetches the
        // same line of the row a panel on into L2 (rows are K/2 bytes apart) instead of fetching
        // ahead within the row, so that a panel's first chunk does not wait on memory:
        // mxfp4_gemm M=8 measured 0.95x the time, fused_moe T=256 0.89x.
        const uint8_t* bytes = static_cast<const uint8_t*>(rows[r]) + p0;
        decode_mxfp4_pairs(bytes, scales[r] + p0 / 16, pairs / 16, row, false);
        __builtin_prefetch(bytes + next_panel, 0, 1);
      } else {
        decode_pairs<Wide, Rows>(rows[r], scales[r], K, 2 * p0, 2 * (p0 + pairs), row);
      }
    }
  }
};

// Each block of up to 2 x 2 C tiles (the panel's rows by 32 lanes) stays in the tiles over all
// of K. The first block decodes chunk i + 1 while its products over chunk i run, a share of the
// rows after each step; the later blocks read the decoded panel (in L2).
template <typename Rows>
GNOMON_TARGET_AMX void lanes_rows_amx(const void* const* rows, const uint8_t* const* scales, int nr,
                                      const void* b, int64_t lanes, int64_t K, void* panel,
                                      float* c) {
  const int64_t depth = amx_depth(K), chunks = (depth + kAmxChunk - 1) / kAmxChunk;
  const int64_t padded = (nr + kAmxRows - 1) / kAmxRows * kAmxRows;
  const AmxChunkDecoder<Rows> decode{
      rows, scales, nr, K, depth, static_cast<uint32_t*>(panel), lanes <= 32 ? 2 : chunks};
  struct DecodeNext {
    const AmxChunkDecoder<Rows>& decode;
    int64_t next, padded;
    GNOMON_TARGET_AMX void operator()(int64_t step, int64_t steps) const {
      if (next >= 0) decode(next, padded * step / steps, padded * (step + 1) / steps);
    }
  };
  auto block = [&](auto rt, auto ct, int64_t v) {
    constexpr int RT = decltype(rt)::value, CT = decltype(ct)::value;
    amx_c_begin<RT, CT, 0>(c + v, lanes, false);
    for (int64_t i = 0; i < chunks; ++i) {
      const int64_t p0 = i * kAmxChunk, pairs = std::min(kAmxChunk, depth - p0);
      amx_products<RT, CT, 0>(decode.chunk(i), pairs, static_cast<const uint32_t*>(b) +
                              p0 * lanes + v, lanes, pairs,
                              DecodeNext{decode, v == 0 && i + 1 < chunks ? i + 1 : -1, padded});
    }
    amx_c_end<RT, CT, 0>(c + v, lanes);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  amx_begin();
  decode(0, 0, padded);
  for (int64_t v = 0; v < lanes; v += 32) {
    const bool two_lanes = v + 32 <= lanes;
    if (padded > kAmxRows) {
      two_lanes ? block(Two{}, Two{}, v) : block(Two{}, One{}, v);
    } else {
      two_lanes ? block(One{}, Two{}, v) : block(One{}, One{}, v);
    }
  }
  amx_end();
}

}  // namespace gnomon::cpu
#endif
