// topk_routing and fused_moe.
//
// fused_moe groups the (token, k) assignments by expert, so every active expert's weights stream
// through the cache once per call however many tokens chose it:
//   1. gate/up: for each active expert, blocks of intermediate rows are work items; each item
//      streams its gate and up rows once, takes dot products with all the expert's tokens, adds
//      the bias and applies the activation into a float32 buffer A [slot, I];
//   2. down: blocks of output columns h are work items; each item walks every active expert's
//      w2 rows in its block, so it alone owns out[:, block] and accumulates the routing-weighted
//      expert outputs for all tokens without atomics, then stores them in hidden's dtype.
// Both phases split the weight rows (the N dim) across threads, so decode with a handful of
// tokens still uses every thread. MXFP4 weights are decoded in registers, 32 elements at a time,
// through a 16-entry lookup scaled by the block's E8M0 scale; no full-precision weight exists.
// For MXFP4 the activations (hidden, and A) are stored with each 32-element block split into its
// even and odd elements, matching the low and high nibbles of the packed bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "core/scalar_math.h"
#include "core/simd.h"
#include "cpu/kernels.h"
#include "cpu/vec.h"

namespace gnomon::cpu {
namespace {

// ---- routing ------------------------------------------------------------------------------------

void route_row(const float* logits, int64_t num_experts, int k, RoutingMode mode,
               bool renormalize, float* probs, float* weights, int32_t* ids) {
  int count = 0;
  if (mode == RoutingMode::SoftmaxTopk) {
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < num_experts; ++i) max = logits[i] > max ? logits[i] : max;
    float sum = 0.0f;
    for (int64_t i = 0; i < num_experts; ++i) {
      probs[i] = std::exp(logits[i] - max);
      sum += probs[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < num_experts; ++i) {
      math::topk_insert(probs[i] * inv, static_cast<int32_t>(i), weights, ids, count, k);
    }
    if (renormalize) {
      float top_sum = 0.0f;
      for (int j = 0; j < k; ++j) top_sum += weights[j];
      for (int j = 0; j < k; ++j) weights[j] /= top_sum;
    }
  } else {
    for (int64_t i = 0; i < num_experts; ++i) {
      math::topk_insert(logits[i], static_cast<int32_t>(i), weights, ids, count, k);
    }
    const float max = weights[0];  // the list is in descending order
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      weights[j] = std::exp(weights[j] - max);
      sum += weights[j];
    }
    for (int j = 0; j < k; ++j) weights[j] /= sum;
  }
}

// ---- register tiles: dot products of up to 4 weight rows with up to 4 token rows ------------
//
// Written with GCC/Clang vector extensions over 8 floats, which every target lowers to its own
// instructions (AVX-512VL, AVX2, SSE, NEON); GNOMON_SIMD_CLONES picks the clone at load time.
// bf16 and MXFP4 rows decode into even and odd elements separately (a 32-bit word holds two bf16
// values, a byte two E2M1 codes), so the activations they meet are stored "split": every
// 16-element group holds its 8 even elements, then its 8 odd ones.

#define GNOMON_ALWAYS_INLINE inline __attribute__((always_inline))

typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x4 __attribute__((vector_size(16)));

GNOMON_ALWAYS_INLINE void load8(const float* p, f32x8& v) { memcpy(&v, p, sizeof(v)); }

GNOMON_ALWAYS_INLINE float hsum(const f32x8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// {w[i], w[i], w[i], w[i], w[i + 1], w[i + 1], w[i + 1], w[i + 1]}
template <int i>
GNOMON_ALWAYS_INLINE void spread_words(const u32x4& w, u32x8& r) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  r = __builtin_shufflevector(w, w, i, i, i, i, i + 1, i + 1, i + 1, i + 1);
#else
  r = u32x8{w[i], w[i], w[i], w[i], w[i + 1], w[i + 1], w[i + 1], w[i + 1]};
#endif
}

// r[j] = table[idx[j]] with table = {lo, hi} and idx in [0, 16).
GNOMON_ALWAYS_INLINE void lookup16(const f32x8& lo, const f32x8& hi, const i32x8& idx, f32x8& r) {
#if defined(__GNUC__) && !defined(__clang__)
  r = __builtin_shuffle(lo, hi, idx);
#else
  for (int j = 0; j < 8; ++j) r[j] = idx[j] < 8 ? lo[idx[j] & 7] : hi[idx[j] & 7];
#endif
}

// Dense tiles: out[r * ld + t] = sum_k row_r[k] * x_t[k] for NR rows and NT tokens.
template <int NR, int NT>
struct F32Tile {
  static GNOMON_ALWAYS_INLINE void run(const void* const* rows, const uint8_t* const*,
                                       const float* const* xs, int64_t K, float* out,
                                       int64_t ld) {
    f32x8 acc[NR][NT];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = f32x8{};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      f32x8 x[NT];
      for (int t = 0; t < NT; ++t) load8(xs[t] + k, x[t]);
      for (int r = 0; r < NR; ++r) {
        f32x8 w;
        load8(static_cast<const float*>(rows[r]) + k, w);
        for (int t = 0; t < NT; ++t) acc[r][t] += w * x[t];
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        float sum = hsum(acc[r][t]);
        for (int64_t j = k; j < K; ++j) sum += static_cast<const float*>(rows[r])[j] * xs[t][j];
        out[r * ld + t] = sum;
      }
    }
  }
};

template <int NR, int NT>
struct F16Tile {
  static GNOMON_ALWAYS_INLINE void run(const void* const* rows, const uint8_t* const*,
                                       const float* const* xs, int64_t K, float* out,
                                       int64_t ld) {
    f32x8 acc[NR][NT];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = f32x8{};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      f32x8 x[NT];
      for (int t = 0; t < NT; ++t) load8(xs[t] + k, x[t]);
      for (int r = 0; r < NR; ++r) {
        const uint16_t* p = static_cast<const uint16_t*>(rows[r]) + k;
        f32x8 w;
        for (int j = 0; j < 8; ++j) w[j] = math::fp16_to_float(p[j]);
        for (int t = 0; t < NT; ++t) acc[r][t] += w * x[t];
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        float sum = hsum(acc[r][t]);
        for (int64_t j = k; j < K; ++j) {
          sum += math::fp16_to_float(static_cast<const uint16_t*>(rows[r])[j]) * xs[t][j];
        }
        out[r * ld + t] = sum;
      }
    }
  }
};

// bf16 rows against split activations: the bf16 pair in each 32-bit word gives an even element
// (low half, shifted up) and an odd one (high half, masked).
template <int NR, int NT>
struct BF16Tile {
  static GNOMON_ALWAYS_INLINE void run(const void* const* rows, const uint8_t* const*,
                                       const float* const* xs, int64_t K, float* out,
                                       int64_t ld) {
    f32x8 acc[NR][NT];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = f32x8{};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      f32x8 even[NT], odd[NT];
      for (int t = 0; t < NT; ++t) {
        load8(xs[t] + k, even[t]);
        load8(xs[t] + k + 8, odd[t]);
      }
      for (int r = 0; r < NR; ++r) {
        u32x8 pairs;
        memcpy(&pairs, static_cast<const uint16_t*>(rows[r]) + k, sizeof(pairs));
        const f32x8 w_even = (f32x8)(pairs << 16);  // vector casts reinterpret the bits
        const f32x8 w_odd = (f32x8)(pairs & 0xffff0000u);
        for (int t = 0; t < NT; ++t) {
          acc[r][t] += w_even * even[t];
          acc[r][t] += w_odd * odd[t];
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        float sum = hsum(acc[r][t]);
        for (int64_t j = k; j < K; ++j) {  // the tail is stored unsplit
          sum += math::bf16_to_float(static_cast<const uint16_t*>(rows[r])[j]) * xs[t][j];
        }
        out[r * ld + t] = sum;
      }
    }
  }
};

// MXFP4 rows (K/2 packed bytes, K/32 E8M0 scales; K % 32 == 0) against split activations: the
// low nibbles of 8 bytes are the group's even elements, the high nibbles its odd ones. Each
// block's scale multiplies the 16-entry code table, and a permute looks the codes up in it.
template <int NR, int NT>
struct Mxfp4Tile {
  static GNOMON_ALWAYS_INLINE void run(const void* const* rows, const uint8_t* const* scales,
                                       const float* const* xs, int64_t K, float* out,
                                       int64_t ld, const float* e8m0) {
    const f32x8 codes_lo = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const f32x8 codes_hi = -codes_lo;
    const u32x8 shift_lo = {0, 8, 16, 24, 0, 8, 16, 24};
    const u32x8 shift_hi = shift_lo + 4;
    f32x8 acc[NR][NT];
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) acc[r][t] = f32x8{};
    const int64_t blocks = K / 32;
    for (int64_t b = 0; b < blocks; ++b) {
      f32x8 x[NT][4];  // even, odd of the first 16 elements; even, odd of the second 16
      for (int t = 0; t < NT; ++t)
        for (int q = 0; q < 4; ++q) load8(xs[t] + 32 * b + 8 * q, x[t][q]);
      for (int r = 0; r < NR; ++r) {
        u32x4 words;
        memcpy(&words, static_cast<const uint8_t*>(rows[r]) + 16 * b, sizeof(words));
        const float scale = e8m0[scales[r][b]];
        const f32x8 table_lo = codes_lo * scale, table_hi = codes_hi * scale;
        u32x8 spread[2];
        spread_words<0>(words, spread[0]);
        spread_words<2>(words, spread[1]);
        for (int g = 0; g < 2; ++g) {
          f32x8 w_even, w_odd;
          lookup16(table_lo, table_hi, (i32x8)((spread[g] >> shift_lo) & 15u), w_even);
          lookup16(table_lo, table_hi, (i32x8)((spread[g] >> shift_hi) & 15u), w_odd);
          for (int t = 0; t < NT; ++t) {
            acc[r][t] += w_even * x[t][2 * g];
            acc[r][t] += w_odd * x[t][2 * g + 1];
          }
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int t = 0; t < NT; ++t) out[r * ld + t] = hsum(acc[r][t]);
  }
};

// out[r * nt + t] = dot(row r, x_t) for nr <= 4 weight rows and nt tokens, in 4 x 4 tiles.
template <template <int, int> class Tile, class... Extra>
GNOMON_ALWAYS_INLINE void tiled_dots(const void* const* rows, const uint8_t* const* scales,
                                     int nr, const float* const* xs, int nt, int64_t K,
                                     float* out, Extra... extra) {
  for (int t0 = 0; t0 < nt; t0 += 4) {
    const int n = std::min(4, nt - t0);
    const float* const* x = xs + t0;
    if (nr == 4) {
      switch (n) {
        case 1: Tile<4, 1>::run(rows, scales, x, K, out + t0, nt, extra...); break;
        case 2: Tile<4, 2>::run(rows, scales, x, K, out + t0, nt, extra...); break;
        case 3: Tile<4, 3>::run(rows, scales, x, K, out + t0, nt, extra...); break;
        default: Tile<4, 4>::run(rows, scales, x, K, out + t0, nt, extra...); break;
      }
      continue;
    }
    for (int r = 0; r < nr; ++r) {
      float* o = out + r * nt + t0;
      switch (n) {
        case 1: Tile<1, 1>::run(rows + r, scales + r, x, K, o, nt, extra...); break;
        case 2: Tile<1, 2>::run(rows + r, scales + r, x, K, o, nt, extra...); break;
        case 3: Tile<1, 3>::run(rows + r, scales + r, x, K, o, nt, extra...); break;
        default: Tile<1, 4>::run(rows + r, scales + r, x, K, o, nt, extra...); break;
      }
    }
  }
}

using DotsFn = void (*)(const void* const*, const uint8_t* const*, int, const float* const*, int,
                        int64_t, float*);

GNOMON_SIMD_CLONES void dots_f32(const void* const* rows, const uint8_t* const* scales, int nr,
                                 const float* const* xs, int nt, int64_t K, float* out) {
  tiled_dots<F32Tile>(rows, scales, nr, xs, nt, K, out);
}

GNOMON_SIMD_CLONES void dots_bf16(const void* const* rows, const uint8_t* const* scales, int nr,
                                  const float* const* xs, int nt, int64_t K, float* out) {
  tiled_dots<BF16Tile>(rows, scales, nr, xs, nt, K, out);
}

GNOMON_SIMD_CLONES void dots_f16(const void* const* rows, const uint8_t* const* scales, int nr,
                                 const float* const* xs, int nt, int64_t K, float* out) {
  tiled_dots<F16Tile>(rows, scales, nr, xs, nt, K, out);
}

struct E8M0Table {
  float value[256];
  E8M0Table() {
    for (int i = 0; i < 256; ++i) value[i] = math::e8m0_to_float(static_cast<uint8_t>(i));
  }
};
const E8M0Table kE8M0;

GNOMON_SIMD_CLONES void dots_mxfp4(const void* const* rows, const uint8_t* const* scales, int nr,
                                   const float* const* xs, int nt, int64_t K, float* out) {
  tiled_dots<Mxfp4Tile>(rows, scales, nr, xs, nt, K, out, kE8M0.value);
}

DotsFn dots_for(DType weight_dtype) {
  switch (weight_dtype) {
    case DType::UInt8: return dots_mxfp4;
    case DType::BFloat16: return dots_bf16;
    case DType::Float16: return dots_f16;
    default: return dots_f32;
  }
}

// Where element j of a K-element activation row lives for weights of `dtype`: split (each whole
// 16-element group as its even elements, then its odd ones) for bf16 and MXFP4, else as is.
struct Layout {
  bool split;
  int64_t split_end;  // K rounded down to 16: the tail after it stays unsplit
  Layout(DType dtype, int64_t K)
      : split(dtype == DType::BFloat16 || dtype == DType::UInt8), split_end(K & ~int64_t{15}) {}
  int64_t operator()(int64_t j) const {
    if (!split || j >= split_end) return j;
    return (j & ~int64_t{15}) | ((j & 1) << 3) | ((j & 15) >> 1);
  }
};

float scalar_at(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::BFloat16: return math::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::Float16: return math::fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// One expert projection: row r of expert e starts at data + (e * rows + r) * row_bytes.
struct Projection {
  const char* data;
  int64_t rows, row_bytes;
  const uint8_t* scales;  // MXFP4 only: [E, rows, K/32]
  int64_t scale_row;
  const char* bias;  // [E, rows] in bias_dtype, or null
  DType bias_dtype;

  const void* row(int64_t e, int64_t r) const { return data + (e * rows + r) * row_bytes; }
  const uint8_t* scale(int64_t e, int64_t r) const {
    return scales == nullptr ? nullptr : scales + (e * rows + r) * scale_row;
  }
  float bias_at(int64_t e, int64_t r) const {
    return bias == nullptr ? 0.0f : scalar_at(bias, bias_dtype, e * rows + r);
  }
};

Projection make_projection(const TensorView& w, const TensorView* scales, const TensorView* bias) {
  Projection p;
  p.data = static_cast<const char*>(w.data);
  p.rows = w.size(1);
  p.row_bytes = w.size(2) * dtype_size(w.dtype);
  p.scales = scales == nullptr ? nullptr : scales->ptr<const uint8_t>();
  p.scale_row = scales == nullptr ? 0 : scales->size(2);
  p.bias = bias == nullptr ? nullptr : static_cast<const char*>(bias->data);
  p.bias_dtype = bias == nullptr ? DType::Float32 : bias->dtype;
  return p;
}

constexpr int64_t kUpBlock = 32;     // intermediate columns per gate/up work item
constexpr int64_t kDownBlock = 16;   // output columns per down work item
constexpr int64_t kChunkBytes = 64 << 20;  // float32 buffers per token chunk

}  // namespace

void topk_routing(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& router_logits, int64_t top_k, RoutingMode mode,
                  bool renormalize) {
  const int64_t tokens = router_logits.size(0), experts = router_logits.size(1);
  const int k = static_cast<int>(top_k);
  const int64_t elem = dtype_size(router_logits.dtype);
  parallel_for(tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(experts, 1)),
               [&](int64_t begin, int64_t end) {
    std::vector<float> logits(experts), probs(experts);
    for (int64_t t = begin; t < end; ++t) {
      load_floats(static_cast<const char*>(router_logits.data) + t * experts * elem,
                  router_logits.dtype, logits.data(), experts);
      route_row(logits.data(), experts, k, mode, renormalize, probs.data(),
                topk_weights.ptr<float>() + t * k, topk_ids.ptr<int32_t>() + t * k);
    }
  });
}

void fused_moe(const TensorView& out, const TensorView& hidden, const TensorView& w13,
               const TensorView& w2, const TensorView& topk_weights, const TensorView& topk_ids,
               Activation activation, GateUpLayout gate_up_layout, const TensorView* w13_bias,
               const TensorView* w2_bias, const TensorView* w13_scales,
               const TensorView* w2_scales) {
  const int64_t tokens = hidden.size(0), H = hidden.size(1), top_k = topk_ids.size(1);
  const int64_t E = w13.size(0), I = w13.size(1) / 2;
  if (tokens == 0 || H == 0) return;
  const Layout x_layout(w13.dtype, H), a_layout(w13.dtype, I);
  const DotsFn dots = dots_for(w13.dtype);
  const Projection up = make_projection(w13, w13_scales, w13_bias);
  const Projection down = make_projection(w2, w2_scales, w2_bias);
  const DType dtype = hidden.dtype;
  const int64_t elem = dtype_size(dtype);
  const bool interleaved = gate_up_layout == GateUpLayout::Interleaved;
  const float* routing = topk_weights.ptr<const float>();
  const int32_t* ids = topk_ids.ptr<const int32_t>();

  // Tokens go through in chunks that bound the float32 buffers (a chunk re-reads the weights).
  const int64_t chunk = std::max<int64_t>(
      1, std::min(tokens, kChunkBytes / static_cast<int64_t>(sizeof(float) * (H + top_k * I))));
  std::unique_ptr<float[]> x(new float[chunk * H]);
  std::unique_ptr<float[]> a(new float[chunk * top_k * I]);
  std::vector<int64_t> offsets(E + 1);
  std::vector<int32_t> slot_token(chunk * top_k);
  std::vector<float> slot_weight(chunk * top_k);
  std::vector<const float*> slot_x(chunk * top_k), slot_a(chunk * top_k);
  std::vector<int64_t> active;

  for (int64_t c0 = 0; c0 < tokens; c0 += chunk) {
    const int64_t n = std::min(chunk, tokens - c0);

    // Group the chunk's (token, k) assignments by expert: slots [offsets[e], offsets[e + 1]).
    std::fill(offsets.begin(), offsets.end(), 0);
    for (int64_t i = c0 * top_k; i < (c0 + n) * top_k; ++i) ++offsets[ids[i] + 1];
    active.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (offsets[e + 1] > 0) active.push_back(e);
      offsets[e + 1] += offsets[e];
    }
    {
      std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < top_k; ++j) {
          const int64_t i = (c0 + t) * top_k + j, s = next[ids[i]]++;
          slot_token[s] = static_cast<int32_t>(t);
          slot_weight[s] = routing[i];
          slot_x[s] = x.get() + t * H;
          slot_a[s] = a.get() + s * I;
        }
      }
    }

    // Hidden rows in float32, laid out for the weights' tiles.
    parallel_for(n, std::max<int64_t>(1, 16384 / H), [&](int64_t begin, int64_t end) {
      std::vector<float> row(x_layout.split ? H : 0);
      for (int64_t t = begin; t < end; ++t) {
        const char* src = static_cast<const char*>(hidden.data) + (c0 + t) * H * elem;
        if (!x_layout.split) {
          load_floats(src, dtype, x.get() + t * H, H);
          continue;
        }
        load_floats(src, dtype, row.data(), H);
        for (int64_t j = 0; j < H; ++j) x[t * H + x_layout(j)] = row[j];
      }
    });

    // Gate/up and activation: items are (active expert, block of kUpBlock intermediate columns).
    const int64_t up_blocks = (I + kUpBlock - 1) / kUpBlock;
    parallel_for(static_cast<int64_t>(active.size()) * up_blocks, 1,
                 [&](int64_t begin, int64_t end) {
      std::vector<float> dot(4 * n * top_k);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t e = active[item / up_blocks];
        const int64_t j0 = (item % up_blocks) * kUpBlock, j1 = std::min(I, j0 + kUpBlock);
        const int64_t first = offsets[e];
        const int nt = static_cast<int>(offsets[e + 1] - first);
        for (int64_t j = j0; j < j1; j += 2) {
          const int pairs = j + 1 < j1 ? 2 : 1;
          const void* rows[4];
          const uint8_t* scales[4];
          int64_t row_ids[4];
          for (int p = 0; p < pairs; ++p) {
            row_ids[2 * p] = interleaved ? 2 * (j + p) : j + p;          // gate
            row_ids[2 * p + 1] = interleaved ? 2 * (j + p) + 1 : I + j + p;  // up
          }
          for (int r = 0; r < 2 * pairs; ++r) {
            rows[r] = up.row(e, row_ids[r]);
            scales[r] = up.scale(e, row_ids[r]);
          }
          dots(rows, scales, 2 * pairs, slot_x.data() + first, nt, H, dot.data());
          for (int p = 0; p < pairs; ++p) {
            const float gate_bias = up.bias_at(e, row_ids[2 * p]);
            const float up_bias = up.bias_at(e, row_ids[2 * p + 1]);
            const float* gate = dot.data() + 2 * p * nt;
            const float* upv = gate + nt;
            const int64_t col = a_layout(j + p);
            for (int t = 0; t < nt; ++t) {
              const float g = gate[t] + gate_bias, u = upv[t] + up_bias;
              a[(first + t) * I + col] = activation == Activation::Silu ? math::silu_and_mul(g, u)
                                                                         : math::swiglu_oai(g, u);
            }
          }
        }
      }
    });

    // Down projection: items are blocks of output columns; each owns out[chunk, block].
    const int64_t down_blocks = (H + kDownBlock - 1) / kDownBlock;
    parallel_for(down_blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> dot(4 * n * top_k), acc(n * kDownBlock);
      for (int64_t block = begin; block < end; ++block) {
        const int64_t h0 = block * kDownBlock, width = std::min(kDownBlock, H - h0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (const int64_t e : active) {
          const int64_t first = offsets[e];
          const int nt = static_cast<int>(offsets[e + 1] - first);
          for (int64_t h = h0; h < h0 + width; h += 4) {
            const int nr = static_cast<int>(std::min<int64_t>(4, h0 + width - h));
            const void* rows[4];
            const uint8_t* scales[4];
            for (int r = 0; r < nr; ++r) {
              rows[r] = down.row(e, h + r);
              scales[r] = down.scale(e, h + r);
            }
            dots(rows, scales, nr, slot_a.data() + first, nt, I, dot.data());
            for (int r = 0; r < nr; ++r) {
              const float bias = down.bias_at(e, h + r);
              for (int t = 0; t < nt; ++t) {
                const int64_t s = first + t;
                acc[slot_token[s] * kDownBlock + (h - h0) + r] +=
                    slot_weight[s] * (dot[r * nt + t] + bias);
              }
            }
          }
        }
        for (int64_t t = 0; t < n; ++t) {
          store_floats(acc.data() + t * kDownBlock, dtype,
                       static_cast<char*>(out.data) + ((c0 + t) * H + h0) * elem, width);
        }
      }
    });
  }
}

}  // namespace gnomon::cpu
