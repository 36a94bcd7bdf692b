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
#include <atomic>
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
// A tile sets out[r * ld + t] = dot(row r, x_t) for NR weight rows and NT float32 token rows,
// keeping NR x NT accumulators in registers, and prefetches each row stream kPrefetchBytes ahead
// (the rows a thread reads next lie behind it). One template over the vector width V (vec.h):
// Narrow in a cloned function (AVX2, the baseline), Wide in one built for AVX-512.
//
// A weight kind decodes a step of its row into float vectors. float32 and float16 rows give L
// consecutive elements per step; bf16 and MXFP4 rows give 2L, as their even and odd elements
// separately (a 32-bit word holds two bf16 values, a byte two E2M1 codes), so the activations
// they meet are stored "split": every group of G = 2L elements holds its even elements, then
// its odd ones (see Layout). Dense rows meet activations as they are.

constexpr int64_t kPrefetchBytes = 16384;

struct E8M0Table {
  float value[256];
  E8M0Table() {
    for (int i = 0; i < 256; ++i) value[i] = math::e8m0_to_float(static_cast<uint8_t>(i));
  }
};
const E8M0Table kE8M0;

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
    const auto halves = load<typename V::H>(static_cast<const uint16_t*>(row) + k);
    w[0] = half_to_float<V>(__builtin_convertvector(halves, typename V::U));
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
    const auto bytes = load<typename V::B>(static_cast<const uint8_t*>(row) + k / 2);
    const typename V::U codes = __builtin_convertvector(bytes, typename V::U);
    const typename V::F table = e2m1_table<V>() * kE8M0.value[scales[k / 32]];
    w[0] = decode_nibbles<V>(table, codes, 0);
    w[1] = decode_nibbles<V>(table, codes, 4);
  }
  static float at(const void*, int64_t) { return 0.0f; }  // K % 32 == 0: no tail
};

template <typename V, typename Rows, int NR, int NT>
GNOMON_INLINE void tile(const void* const* rows, const uint8_t* const* scales,
                        const float* const* xs, int64_t K, float* out, int64_t ld) {
  using F = typename V::F;
  constexpr int W = Rows::kVectors;
  constexpr int64_t step = W * V::L;
  F acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = F{};
  }
  int64_t k = 0;
  for (; k + step <= K; k += step) {
    F x[NT][W];
    for (int t = 0; t < NT; ++t) {
      for (int i = 0; i < W; ++i) x[t][i] = load<F>(xs[t] + k + i * V::L);
    }
    for (int r = 0; r < NR; ++r) {
      const char* bytes = static_cast<const char*>(rows[r]) + Rows::offset(k);
      if (Rows::offset(k) % 64 == 0) __builtin_prefetch(bytes + kPrefetchBytes);
      F w[W];
      Rows::decode(rows[r], scales[r], k, w);
      for (int t = 0; t < NT; ++t) {
        for (int i = 0; i < W; ++i) acc[r][t] += w[i] * x[t][i];
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) {
      float sum = reduce_add(acc[r][t]);
      for (int64_t j = k; j < K; ++j) sum += Rows::at(rows[r], j) * xs[t][j];  // stored unsplit
      out[r * ld + t] = sum;
    }
  }
}

// out[r * nt + t] for nr <= 4 rows and nt tokens, in 4 x 4 tiles.
template <typename V, typename Rows>
GNOMON_INLINE void dots(const void* const* rows, const uint8_t* const* scales, int nr,
                        const float* const* xs, int nt, int64_t K, float* out) {
  for (int t0 = 0; t0 < nt; t0 += 4) {
    const int n = std::min(4, nt - t0);
    const float* const* x = xs + t0;
    if (nr == 4) {
      switch (n) {
        case 1: tile<V, Rows, 4, 1>(rows, scales, x, K, out + t0, nt); break;
        case 2: tile<V, Rows, 4, 2>(rows, scales, x, K, out + t0, nt); break;
        case 3: tile<V, Rows, 4, 3>(rows, scales, x, K, out + t0, nt); break;
        default: tile<V, Rows, 4, 4>(rows, scales, x, K, out + t0, nt); break;
      }
      continue;
    }
    for (int r = 0; r < nr; ++r) {
      float* o = out + r * nt + t0;
      switch (n) {
        case 1: tile<V, Rows, 1, 1>(rows + r, scales + r, x, K, o, nt); break;
        case 2: tile<V, Rows, 1, 2>(rows + r, scales + r, x, K, o, nt); break;
        case 3: tile<V, Rows, 1, 3>(rows + r, scales + r, x, K, o, nt); break;
        default: tile<V, Rows, 1, 4>(rows + r, scales + r, x, K, o, nt); break;
      }
    }
  }
}

#define GNOMON_DOTS_ARGS                                                                  \
  const void *const *rows, const uint8_t *const *scales, int nr, const float *const *xs, \
      int nt, int64_t K, float *out
#if GNOMON_HAS_WIDE_KERNELS
#define GNOMON_DEFINE_DOTS(Rows)                                                          \
  GNOMON_SIMD_CLONES void Rows##_narrow(GNOMON_DOTS_ARGS) {                               \
    dots<Narrow, Rows<Narrow>>(rows, scales, nr, xs, nt, K, out);                         \
  }                                                                                       \
  GNOMON_TARGET_WIDE void Rows##_wide(GNOMON_DOTS_ARGS) {                                 \
    dots<Wide, Rows<Wide>>(rows, scales, nr, xs, nt, K, out);                             \
  }
#else
#define GNOMON_DEFINE_DOTS(Rows)                                                          \
  GNOMON_SIMD_CLONES void Rows##_narrow(GNOMON_DOTS_ARGS) {                               \
    dots<Narrow, Rows<Narrow>>(rows, scales, nr, xs, nt, K, out);                         \
  }
#endif
GNOMON_DEFINE_DOTS(F32Rows)
GNOMON_DEFINE_DOTS(F16Rows)
GNOMON_DEFINE_DOTS(BF16Rows)
GNOMON_DEFINE_DOTS(Mxfp4Rows)
#undef GNOMON_DEFINE_DOTS

using DotsFn = void (*)(GNOMON_DOTS_ARGS);

// The dots for one weight dtype, and the split group size G its activations need (0: unsplit).
struct Dots {
  DotsFn fn;
  int64_t group;
};

Dots dots_for(DType weight_dtype) {
  const bool wide = GNOMON_HAS_WIDE_KERNELS && kernel_isa() != Isa::Narrow;
#if GNOMON_HAS_WIDE_KERNELS
#define GNOMON_PICK(Rows) \
  wide ? Dots{Rows##_wide, Rows<Wide>::kSplit} : Dots{Rows##_narrow, Rows<Narrow>::kSplit}
#else
#define GNOMON_PICK(Rows) Dots{Rows##_narrow, Rows<Narrow>::kSplit}
#endif
  switch (weight_dtype) {
    case DType::UInt8: return GNOMON_PICK(Mxfp4Rows);
    case DType::BFloat16: return GNOMON_PICK(BF16Rows);
    case DType::Float16: return GNOMON_PICK(F16Rows);
    default: return GNOMON_PICK(F32Rows);
  }
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

// Hands out work items to the threads of one parallel_for, one at a time: each thread (ticket)
// walks its own contiguous share of the items in order, then helps with what is left of the
// others'. parallel_for alone hands out chunks of about n / (4 threads), so one thread that the
// OS preempts can hold up a decode call; here it holds up at most one small item, and the
// weight streams stay contiguous per thread.
class ItemQueue {
 public:
  explicit ItemQueue(int64_t n)
      : n_(n), shares_(std::max<int64_t>(1, std::min<int64_t>(n, num_threads()))),
        next_(shares_) {
    for (int64_t p = 0; p < shares_; ++p) next_[p].store(begin(p), std::memory_order_relaxed);
  }
  int64_t tickets() const { return n_ == 0 ? 0 : shares_; }
  bool take(int64_t ticket, int64_t& item) {
    for (int64_t i = 0; i < shares_; ++i) {
      const int64_t p = (ticket + i) % shares_;
      item = next_[p].fetch_add(1, std::memory_order_relaxed);
      if (item < begin(p + 1)) return true;
    }
    return false;
  }

 private:
  int64_t begin(int64_t share) const { return n_ * share / shares_; }
  const int64_t n_, shares_;
  std::vector<std::atomic<int64_t>> next_;
};

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
  const Dots kernel = dots_for(w13.dtype);
  const DotsFn dots = kernel.fn;
  const Layout x_layout(kernel.group, H), a_layout(kernel.group, I);
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
    int64_t most = 0;  // the most slots one expert has
    for (int64_t e = 0; e < E; ++e) {
      if (offsets[e + 1] > 0) active.push_back(e);
      most = std::max(most, offsets[e + 1]);
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

    // Gate/up and activation: items are (active expert, block of kUpBlock intermediate columns).
    const int64_t up_blocks = (I + kUpBlock - 1) / kUpBlock;
    ItemQueue up_items(static_cast<int64_t>(active.size()) * up_blocks);
    parallel_for(up_items.tickets(), 1, [&](int64_t ticket, int64_t) {
      std::vector<float> dot(4 * most);
      for (int64_t item; up_items.take(ticket, item);) {
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
    ItemQueue down_items((H + kDownBlock - 1) / kDownBlock);
    parallel_for(down_items.tickets(), 1, [&](int64_t ticket, int64_t) {
      std::vector<float> dot(4 * most), acc(n * kDownBlock);
      for (int64_t block; down_items.take(ticket, block);) {
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
