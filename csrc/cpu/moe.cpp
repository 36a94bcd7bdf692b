// topk_routing and fused_moe.
//
// fused_moe groups the (token, k) assignments by expert, so every active expert's weights stream
// through the cache once per call however many tokens chose it:
//   1. gate/up: work items are (active expert, block of intermediate columns); each streams its
//      gate and up rows once, takes dot products with all of the expert's tokens in register
//      tiles, adds the bias and applies the activation into a float32 buffer A [slot, I];
//   2. down: work items are blocks of output columns; each walks every active expert's w2 rows
//      in its block, so it alone owns out[:, block]: it accumulates the routing-weighted expert
//      outputs (bias included) of all tokens in float32 without atomics, then stores them.
// Both phases split the weight rows (the N dim) across threads, so decode with a handful of
// tokens still uses every thread. MXFP4 weights are decoded in registers (a 16-entry code table
// scaled by the block's E8M0 scale, indexed by a permute); no full-precision weight is built.
// Tokens go through in chunks that bound the float32 buffers (kChunkBytes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/parallel.h"
#include "core/scalar_math.h"
#include "core/simd.h"
#include "core/threads.h"
#include "cpu/kernels.h"
#include "cpu/lanes_gemm.h"
#include "cpu/vec.h"
#include "cpu/weight_rows.h"


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
// A tile sets out[r * ld + t] = dot(row r, x_t) for NR weight rows and NT float32 token rows,
// keeping NR x NT accumulators in registers, and prefetches each row stream kPrefetchBytes ahead
// (the rows a thread reads next lie behind it). One template over the vector width V (vec.h):
// Narrow in a cloned function (AVX2, the baseline), Wide in one built for AVX-512. The weight
// kinds (how a row of each dtype decodes) are in weight_rows.h.

constexpr int64_t kPrefetchBytes = 16384;

template <typename V, typename Rows, int NR, int NT>
GNOMON_INLINE void tile(const void* const* rows, const uint8_t* const* scales,
                        const float* const* xs, int64_t K, float* out, int64_t ld) {
  using F = typename V::F;
  constexpr int W = Rows::kVectors;
  constexpr int64_t step = W * V::L;
  // Every loop over NR, NT and W fully unrolled, so that acc and x stay in registers.
  F acc[NR][NT];
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) acc[r][t] = F{};
  }
  int64_t k = 0;
  for (; k + step <= K; k += step) {
    F x[NT][W];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 4
      for (int i = 0; i < W; ++i) x[t][i] = load<F>(xs[t] + k + i * V::L);
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) {
      const char* bytes = static_cast<const char*>(rows[r]) + Rows::offset(k);
      if (Rows::offset(k) % 64 == 0) __builtin_prefetch(bytes + kPrefetchBytes);
      F w[W];
      Rows::decode(rows[r], scales[r], k, w);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 4
        for (int i = 0; i < W; ++i) acc[r][t] += w[i] * x[t][i];
      }
    }
  }
  // Reduced in loops with nothing else in them: with the tail loop inside, GCC kept acc in
  // memory, spilling accumulators on every step of the loop above.
  float sums[NR][NT];
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) sums[r][t] = reduce_add(acc[r][t]);
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      float sum = sums[r][t];
      for (int64_t j = k; j < K; ++j) sum += Rows::at(rows[r], j) * xs[t][j];  // stored unsplit
      out[r * ld + t] = sum;
    }
  }
}

// out[r * nt + t] for nr <= 4 rows and NT tokens (out and xs at the first of them).
template <typename V, typename Rows, int NT>
GNOMON_INLINE void token_tiles(const void* const* rows, const uint8_t* const* scales, int nr,
                               const float* const* xs, int nt, int64_t K, float* out) {
  if (nr == 4) return tile<V, Rows, 4, NT>(rows, scales, xs, K, out, nt);
  for (int r = 0; r < nr; ++r) tile<V, Rows, 1, NT>(rows + r, scales + r, xs, K, out + r * nt, nt);
}

// out[r * nt + t] for nr <= 4 rows and nt tokens, in 4 x 4 tiles.
template <typename V, typename Rows>
GNOMON_INLINE void dots(const void* const* rows, const uint8_t* const* scales, int nr,
                        const float* const* xs, int nt, int64_t K, float* out) {
  int t = 0;
  for (; t + 4 <= nt; t += 4) token_tiles<V, Rows, 4>(rows, scales, nr, xs + t, nt, K, out + t);
  switch (nt - t) {
    case 1: return token_tiles<V, Rows, 1>(rows, scales, nr, xs + t, nt, K, out + t);
    case 2: return token_tiles<V, Rows, 2>(rows, scales, nr, xs + t, nt, K, out + t);
    case 3: return token_tiles<V, Rows, 3>(rows, scales, nr, xs + t, nt, K, out + t);
  }
}

// out[t] = activation(gate[t] + gate_bias, up[t] + up_bias) for t < n, a vector at a time (the
// sigmoid from e^-|x|, which exp_nonpositive gives within 2 ulp), the tail as the scalar math.
GNOMON_SIMD_CLONES void activate(Activation activation, const float* gate, const float* up,
                                 float gate_bias, float up_bias, int n, float* out) {
  using F = Narrow::F;
  const bool oai = activation == Activation::SwigluOai;
  int t = 0;
  for (; t + Narrow::L <= n; t += Narrow::L) {
    F g = load<F>(gate + t) + gate_bias, u = load<F>(up + t) + up_bias;
    if (oai) {  // gate clamped at 7, up to [-7, 7]
      g = select(g > 7.0f, F{} + 7.0f, g);
      u = select(u > 7.0f, F{} + 7.0f, select(u < -7.0f, F{} - 7.0f, u));
    }
    const F x = oai ? g * 1.702f : g;
    const F z = exp_nonpositive<Narrow>(select(x < 0.0f, x, -x));
    const F sigmoid = select(x < 0.0f, z, F{} + 1.0f) / (z + 1.0f);
    store(out + t, oai ? (u + 1.0f) * g * sigmoid : g * sigmoid * u);
  }
  for (; t < n; ++t) {
    const float g = gate[t] + gate_bias, u = up[t] + up_bias;
    out[t] = oai ? math::swiglu_oai(g, u) : math::silu_and_mul(g, u);
  }
}

// ---- tokens in the lanes: the grouped GEMM of an expert with many tokens ---------------------
//
// An expert with enough tokens (kLanesMinTokens, or on AMX kAmxLanesMinTokens, where the
// lanes GEMM ran gpt-oss-20b T=32..64 in 0.7x the tiles' time, and the vector GEMMs in 1.1-1.3x)
// runs as GEMMs with its tokens in the vector lanes (lanes_gemm.h): its activations are
// transposed once per phase into B ([K][lanes] floats, or [K/2][lanes] bf16 pairs on the dot
// path), and each block of weight rows is decoded once into a panel that every token reads as
// broadcast scalars. The dot path (bf16 activations, bf16 or MXFP4 weights) multiplies on
// vdpbf16ps, or on AMX tiles (lanes_rows_amx). An MXFP4 value times its power-of-two scale is a
// bf16 (scale bytes 2..252; beyond, a block underflows to values the dot products read as zero,
// or overflows to inf as in float32), so only the down projection's activations round.

constexpr int64_t kLanesMinTokens = 8;
constexpr int64_t kAmxLanesMinTokens = 4;

#define GNOMON_DOTS_ARGS                                                                  \
  const void *const *rows, const uint8_t *const *scales, int nr, const float *const *xs, \
      int nt, int64_t K, float *out
#define GNOMON_LANES_ARGS                                                                \
  const void *const *rows, const uint8_t *const *scales, int nr, const void *b,         \
      int64_t lanes, int64_t K, void *panel, float *c
#define GNOMON_NARROW_KERNELS(Rows)                                                       \
  GNOMON_SIMD_CLONES void Rows##_narrow(GNOMON_DOTS_ARGS) {                               \
    dots<Narrow, Rows<Narrow>>(rows, scales, nr, xs, nt, K, out);                         \
  }                                                                                       \
  GNOMON_SIMD_CLONES void Rows##_lanes_narrow(GNOMON_LANES_ARGS) {                        \
    lanes_rows<Narrow, Rows<Narrow>, false>(rows, scales, nr, b, lanes, K, panel, c);     \
  }
GNOMON_NARROW_KERNELS(F32Rows)
GNOMON_NARROW_KERNELS(F16Rows)
GNOMON_NARROW_KERNELS(BF16Rows)
GNOMON_NARROW_KERNELS(Mxfp4Rows)
#undef GNOMON_NARROW_KERNELS
#if GNOMON_HAS_WIDE_KERNELS
template <template <typename> class Rows>
GNOMON_TARGET_WIDE void wide_dots(GNOMON_DOTS_ARGS) {
  dots<Wide, Rows<Wide>>(rows, scales, nr, xs, nt, K, out);
}
template <template <typename> class Rows>
GNOMON_TARGET_WIDE void wide_lanes(GNOMON_LANES_ARGS) {
  lanes_rows<Wide, Rows<Wide>, false>(rows, scales, nr, b, lanes, K, panel, c);
}
template <template <typename> class Rows>
GNOMON_TARGET_BF16 void bf16_lanes(GNOMON_LANES_ARGS) {
  lanes_rows<Wide, Rows<Wide>, true>(rows, scales, nr, b, lanes, K, panel, c);
}
#endif

using DotsFn = void (*)(GNOMON_DOTS_ARGS);
using LanesFn = void (*)(GNOMON_LANES_ARGS);

// The kernels for one weight dtype: dot-product tiles and their activations' split group size G
// (0: unsplit), and the tokens-in-lanes GEMM with its vector width and whether it takes bf16
// pairs (dot).
struct Kernels {
  DotsFn dots;
  int64_t group;
  LanesFn lanes;
  int64_t width;
  bool dot;
  int rows = kLanesRows;  // weight rows per lanes call
  bool amx = false;        // AMX tiles: B's depth in whole tiles (amx_depth)
  int64_t lanes_min_tokens = kLanesMinTokens;
};

// `bf16_data`: the activations are bfloat16, so the bf16 dot path keeps them exact.
Kernels kernels_for(DType weight_dtype, bool bf16_data) {
  const Isa isa = kernel_isa();
  const bool wide = GNOMON_HAS_WIDE_KERNELS && isa != Isa::Narrow;
  const bool dot = has_bf16_dot(isa) && bf16_data &&
                   (weight_dtype == DType::BFloat16 || weight_dtype == DType::UInt8);
#if GNOMON_HAS_WIDE_KERNELS
  const bool amx = dot && isa == Isa::Amx;
#define GNOMON_PICK(Rows, DotLanes)                                                          \
  wide ? Kernels{wide_dots<Rows>, Rows<Wide>::kSplit, dot ? DotLanes : wide_lanes<Rows>, 16, \
                 dot, amx ? kAmxLanesRows : kLanesRows, amx,                                \
                 amx ? kAmxLanesMinTokens : kLanesMinTokens}                                \
       : Kernels{Rows##_narrow, Rows<Narrow>::kSplit, Rows##_lanes_narrow, 8, false}
#define GNOMON_DOT_LANES(Rows) amx ? lanes_rows_amx<Rows<Wide>> : bf16_lanes<Rows>
#else
#define GNOMON_PICK(Rows, DotLanes) \
  Kernels{Rows##_narrow, Rows<Narrow>::kSplit, Rows##_lanes_narrow, 8, false}
#endif
  switch (weight_dtype) {
    case DType::UInt8: return GNOMON_PICK(Mxfp4Rows, GNOMON_DOT_LANES(Mxfp4Rows));
    case DType::BFloat16: return GNOMON_PICK(BF16Rows, GNOMON_DOT_LANES(BF16Rows));
    case DType::Float16: return GNOMON_PICK(F16Rows, nullptr);  // dot is false
    default: return GNOMON_PICK(F32Rows, nullptr);
  }
#undef GNOMON_DOT_LANES
#undef GNOMON_PICK
}

// Where element j of a K-element activation row lives: split in whole groups of G (each group's
// even elements, then its odd ones), the tail after the last whole group as is.
struct Layout {
  int64_t group, split_end;
  Layout(int64_t group_size, int64_t K)
      : group(group_size), split_end(group_size > 0 ? K / group_size * group_size : 0) {}
  bool split() const { return group > 0; }
  int64_t operator()(int64_t j) const {
    if (j >= split_end) return j;
    return j / group * group + (j & 1) * (group / 2) + (j % group) / 2;
  }
};

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
    float value = 0.0f;
    if (bias != nullptr) {
      load_floats(bias + (e * rows + r) * dtype_size(bias_dtype), bias_dtype, &value, 1);
    }
    return value;
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
constexpr int64_t kDownLanesCalls = 8;  // ... and lanes calls, where experts have lanes
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
  const DType dtype = hidden.dtype;
  const Kernels kernel = kernels_for(w13.dtype, dtype == DType::BFloat16);
  const DotsFn dots = kernel.dots;
  const Layout x_layout(kernel.group, H), a_layout(kernel.group, I);
  const Projection up = make_projection(w13, w13_scales, w13_bias);
  const Projection down = make_projection(w2, w2_scales, w2_bias);
  const int64_t elem = dtype_size(dtype);
  const bool interleaved = gate_up_layout == GateUpLayout::Interleaved;
  const float* routing = topk_weights.ptr<const float>();
  const int32_t* ids = topk_ids.ptr<const int32_t>();
  // A lanes expert's B rows: floats, or bf16 pairs (half as many rows of 32-bit words).
  auto b_rows = [&](int64_t K) {
#if GNOMON_HAS_WIDE_KERNELS
    if (kernel.amx) return amx_depth(K);
#endif
    return kernel.dot ? (K + 1) / 2 : K;
  };
  const int64_t x_rows = b_rows(H), a_rows = b_rows(I);

  // Tokens go through in chunks that bound the float32 buffers (a chunk re-reads the weights):
  // x, a, and the lanes experts' transposes of both (padded to whole vectors). The chunks are of
  // one size, so that none has too few tokens per expert for the lanes GEMM.
  const int64_t most_per_chunk = std::max<int64_t>(
      1, kChunkBytes / static_cast<int64_t>(sizeof(float) * (H + top_k * (2 * I + H))));
  const int64_t chunks = (tokens + most_per_chunk - 1) / most_per_chunk;
  const int64_t chunk = (tokens + chunks - 1) / chunks;
  std::unique_ptr<float[]> x(new float[chunk * H]);
  std::unique_ptr<float[]> a(new float[chunk * top_k * I]);
  std::vector<int64_t> offsets(E + 1), lanes(E), b_offset(E);
  std::vector<int32_t> slot_token(chunk * top_k);
  std::vector<float> slot_weight(chunk * top_k);
  std::vector<const float*> slot_x(chunk * top_k), slot_a(chunk * top_k);
  std::vector<int64_t> active, lanes_experts;
  // B of the two phases for the lanes experts (words on the dot path), uninitialised, grown to
  // the lanes a chunk needs (none at decode sizes)
  AlignedArray<float> xt, at;
  int64_t b_lanes = 0;

  for (int64_t c0 = 0; c0 < tokens; c0 += chunk) {
    const int64_t n = std::min(chunk, tokens - c0);

    // Group the chunk's (token, k) assignments by expert: slots [offsets[e], offsets[e + 1]).
    std::fill(offsets.begin(), offsets.end(), 0);
    for (int64_t i = c0 * top_k; i < (c0 + n) * top_k; ++i) ++offsets[ids[i] + 1];
    active.clear();
    lanes_experts.clear();
    int64_t most = 0, lane_count = 0;  // the most slots one expert has; lanes over all experts
    for (int64_t e = 0; e < E; ++e) {
      const int64_t count = offsets[e + 1];
      if (count > 0) active.push_back(e);
      lanes[e] = count >= kernel.lanes_min_tokens
                     ? (count + kernel.width - 1) / kernel.width * kernel.width
                     : 0;
      if (lanes[e] > 0) lanes_experts.push_back(e);
      b_offset[e] = lane_count;
      lane_count += lanes[e];
      most = std::max(most, count);
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
    // Expert e's B of a phase: rows of lanes[e] floats at rows * b_offset[e]. Padding lanes and
    // the high half of an odd K's last pair must be zeros (0 * NaN would be NaN), so each is
    // zeroed before it is filled, in parallel below.
    if (lane_count > b_lanes) {
      b_lanes = lane_count;
      xt = make_aligned<float>(x_rows * b_lanes);
      at = make_aligned<float>(a_rows * b_lanes);
    }
    auto x_panel = [&](int64_t e) { return xt.get() + x_rows * b_offset[e]; };
    auto a_panel = [&](int64_t e) { return at.get() + a_rows * b_offset[e]; };

    // Hidden rows in float32, laid out for the weights' tiles.
    parallel_for(n, std::max<int64_t>(1, 16384 / H), [&](int64_t begin, int64_t end) {
      std::vector<float> row(x_layout.split() ? H : 0);
      for (int64_t t = begin; t < end; ++t) {
        const char* src = static_cast<const char*>(hidden.data) + (c0 + t) * H * elem;
        if (!x_layout.split()) {
          load_floats(src, dtype, x.get() + t * H, H);
          continue;
        }
        load_floats(src, dtype, row.data(), H);
        for (int64_t j = 0; j < H; ++j) x[t * H + x_layout(j)] = row[j];
      }
    });
    // ... and transposed for the lanes experts: element (k, lane t) of a float B; on the dot
    // path the 32-bit words of the bf16 hidden row, which are its natural pairs.
    parallel_for(static_cast<int64_t>(lanes_experts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t e = lanes_experts[i], width = lanes[e];
        std::fill(x_panel(e), x_panel(e) + x_rows * width, 0.0f);
        std::fill(a_panel(e), a_panel(e) + a_rows * width, 0.0f);
        for (int64_t t = 0; t < offsets[e + 1] - offsets[e]; ++t) {
          const int64_t s = offsets[e] + t;
          if (!kernel.dot) {
            const float* row = slot_x[s];
            for (int64_t k = 0; k < H; ++k) x_panel(e)[k * width + t] = row[k];
            continue;
          }
          const char* row = static_cast<const char*>(hidden.data) + (c0 + slot_token[s]) * H * 2;
          uint32_t* b = reinterpret_cast<uint32_t*>(x_panel(e)) + t;
          for (int64_t m = 0; m < H / 2; ++m) std::memcpy(b + m * width, row + 4 * m, 4);
          if (H % 2 == 1) std::memcpy(b + H / 2 * width, row + H * 2 - 2, 2);  // little-endian
        }
      }
    });

    // Stores the activations of intermediate column `col` for expert e's nt slots: in `a` for
    // the tiles, in the expert's B of the down phase for the lanes GEMM.
    auto store_activations = [&](int64_t e, int64_t col, const float* gate, const float* upv,
                                 float gate_bias, float up_bias, int nt, float* values) {
      activate(activation, gate, upv, gate_bias, up_bias, nt, values);
      if (lanes[e] == 0) {
        float* dst = a.get() + offsets[e] * I + a_layout(col);
        for (int t = 0; t < nt; ++t) dst[t * I] = values[t];
      } else if (!kernel.dot) {
        float* dst = a_panel(e) + a_layout(col) * lanes[e];
        for (int t = 0; t < nt; ++t) dst[t] = values[t];
      } else {
        uint16_t* dst = reinterpret_cast<uint16_t*>(a_panel(e) + col / 2 * lanes[e]) + col % 2;
        for (int t = 0; t < nt; ++t) dst[2 * t] = math::float_to_bf16(values[t]);
      }
    };

    // Rows row_ids of expert e's projection p against the expert's tokens, row r's products at
    // dot + r * ld: the lanes GEMM over its B, or the tiles over its slots' rows `slot_rows`.
    auto project = [&](const Projection& p, int64_t e, const int64_t* row_ids, int nr,
                       const float* b, const float* const* slot_rows, int64_t K, void* panel,
                       float* dot) {
      const void* rows[kAmxLanesRows];
      const uint8_t* scales[kAmxLanesRows];
      for (int r = 0; r < nr; ++r) {
        rows[r] = p.row(e, row_ids[r]);
        scales[r] = p.scale(e, row_ids[r]);
      }
      if (lanes[e] > 0) return kernel.lanes(rows, scales, nr, b, lanes[e], K, panel, dot);
      dots(rows, scales, nr, slot_rows + offsets[e], static_cast<int>(offsets[e + 1] - offsets[e]),
           K, dot);
    };

    // Gate/up and activation: items are (active expert, block of kUpBlock intermediate columns).
    const int64_t up_blocks = (I + kUpBlock - 1) / kUpBlock;
    int64_t panel_floats = kernel.rows * (std::max(x_rows, a_rows) + 1);
#if GNOMON_HAS_WIDE_KERNELS
    if (kernel.amx) panel_floats = amx_panel_words(std::max(H, I));
#endif
    ItemQueue up_items(static_cast<int64_t>(active.size()) * up_blocks);
    parallel_for(up_items.tickets(), 1, [&](int64_t ticket, int64_t) {
      AlignedVector<float> dot(std::max(4 * most, kernel.rows * (most + kernel.width)));
      AlignedVector<float> panel(panel_floats);
      std::vector<float> values(most);
      for (int64_t item; up_items.take(ticket, item);) {
        const int64_t e = active[item / up_blocks];
        const int64_t j0 = (item % up_blocks) * kUpBlock, j1 = std::min(I, j0 + kUpBlock);
        const int nt = static_cast<int>(offsets[e + 1] - offsets[e]);
        // columns per step: 2 for the tiles (4 rows), half the rows of a lanes call
        const int64_t per_step = lanes[e] > 0 ? kernel.rows / 2 : 2;
        const int64_t ld = lanes[e] > 0 ? lanes[e] : nt;  // dot's row stride
        for (int64_t j = j0; j < j1; j += per_step) {
          const int cols = static_cast<int>(std::min(per_step, j1 - j));
          int64_t row_ids[kAmxLanesRows];
          for (int p = 0; p < cols; ++p) {
            row_ids[2 * p] = interleaved ? 2 * (j + p) : j + p;              // gate
            row_ids[2 * p + 1] = interleaved ? 2 * (j + p) + 1 : I + j + p;  // up
          }
          project(up, e, row_ids, 2 * cols, x_panel(e), slot_x.data(), H, panel.data(),
                  dot.data());
          for (int p = 0; p < cols; ++p) {
            const float gate_bias = up.bias_at(e, row_ids[2 * p]);
            const float up_bias = up.bias_at(e, row_ids[2 * p + 1]);
            const float* gate = dot.data() + 2 * p * ld;
            store_activations(e, j + p, gate, gate + ld, gate_bias, up_bias, nt, values.data());
          }
        }
      }
    });

    // Down projection: items are blocks of output columns; each owns out[chunk, block]. With
    // lanes experts, a block is whole lanes calls' rows, as many as keep threads balanced up to
    // about kDownLanesCalls: each call of an item re-reads the expert's B (the activations).
    int64_t down_block = kDownBlock;
    if (!lanes_experts.empty()) {
      const int64_t calls = (H + kernel.rows - 1) / kernel.rows, threads = num_threads();
      const int64_t share = (calls + threads - 1) / threads;
      const int64_t per_item = std::max<int64_t>(1, share / kDownLanesCalls);
      down_block = (share + per_item - 1) / per_item * kernel.rows;
    }
    ItemQueue down_items((H + down_block - 1) / down_block);
    parallel_for(down_items.tickets(), 1, [&](int64_t ticket, int64_t) {
      AlignedVector<float> dot(std::max(4 * most, kernel.rows * (most + kernel.width)));
      AlignedVector<float> panel(panel_floats);
      std::vector<float> acc(n * down_block);
      for (int64_t block; down_items.take(ticket, block);) {
        const int64_t h0 = block * down_block, width = std::min(down_block, H - h0);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (const int64_t e : active) {
          const int64_t first = offsets[e];
          const int nt = static_cast<int>(offsets[e + 1] - first);
          const int64_t per_step = lanes[e] > 0 ? kernel.rows : 4;
          const int64_t ld = lanes[e] > 0 ? lanes[e] : nt;
          for (int64_t h = h0; h < h0 + width; h += per_step) {
            const int nr = static_cast<int>(std::min<int64_t>(per_step, h0 + width - h));
            int64_t row_ids[kAmxLanesRows];
            for (int r = 0; r < nr; ++r) row_ids[r] = h + r;
            project(down, e, row_ids, nr, a_panel(e), slot_a.data(), I, panel.data(), dot.data());
            for (int r = 0; r < nr; ++r) {
              const float bias = down.bias_at(e, h + r);
              for (int t = 0; t < nt; ++t) {
                const int64_t s = first + t;
                acc[slot_token[s] * down_block + (h - h0) + r] +=
                    slot_weight[s] * (dot[r * ld + t] + bias);
              }
            }
          }
        }
        for (int64_t t = 0; t < n; ++t) {
          store_floats(acc.data() + t * down_block, dtype,
                       static_cast<char*>(out.data) + ((c0 + t) * H + h0) * elem, width);
        }
      }
    });
  }
}

}  // namespace gnomon::cpu
