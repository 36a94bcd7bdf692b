#pragma once
// Expert and GEMM weight rows, by dtype, for the CPU kernels that stream weights (fused_moe,
// mxfp4_gemm), and the tokens-in-lanes product of a block of decoded rows (lanes_gemm.h).
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

constexpr int kLanesRows = 8;  // weight rows decoded into one panel

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
  } else if constexpr (std::is_same_v<Rows, Mxfp4Rows<V>>) {  // K % 32 == 0
    uint32_t* out = static_cast<uint32_t*>(panel);
    for (int64_t k = 0; k < K; k += step) {
      typename V::F w[W];
      Rows::decode(row, scales, k, w);  // even elements, odd elements: exact in bf16
      store(out + k / 2, (bit_cast<typename V::U>(w[0]) >> 16) |
                             (bit_cast<typename V::U>(w[1]) & 0xFFFF0000u));
    }
  } else {  // bf16 rows are bf16 pairs already
    std::memcpy(panel, row, K * sizeof(uint16_t));
    if (K % 2 == 1) static_cast<uint16_t*>(panel)[K] = 0;
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
  lanes_gemm<V, kDot, 2, NI>(nr, panel, depth, 1, depth, b, c, lanes, nullptr);
}

}  // namespace gnomon::cpu
