// reshape_and_cache and paged_attention.
//
// paged_attention splits a call into work items: (sequence, tile of queries, KV heads, range of
// keys). Every query head of a KV head's group is in the item, so each K/V row is read (and
// converted to float) once per group. A prefill tile is up to kRowsPerTile (query, head) rows of
// one KV head; a decode tile is one query over as many KV heads as fit in kRowsPerTile rows, so a
// key's rows for those heads are one contiguous run of the cache. Keys are walked in tiles of
// kKeyTile through the block table with an online softmax per row: the scores of one key tile at
// a time, never a [q, kv] matrix. When the items are too few to keep every thread busy (decode of
// few sequences with long contexts) each tile's key range is split; the splits write partial
// softmaxes (max, sum, unnormalised output) that a second pass merges (OnlineSoftmax::merge).
//
// Scores and value updates run on 16-float vectors (GCC/Clang vector extensions) in functions
// cloned for AVX-512, AVX2 and the baseline. bfloat16 keys are scored straight from the cache with
// AVX512-BF16 dot products where the CPU has them. Prefill items with enough rows per KV head run
// the rows-in-lanes tile kernels of attention_lanes.cpp instead.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "core/scalar_math.h"
#include "core/simd.h"
#include "core/threads.h"
#include "cpu/attention_lanes.h"
#include "cpu/kernels.h"
#include "cpu/vec.h"


namespace gnomon::cpu {

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping) {
  // A slot's row of Hkv * D elements is contiguous in the cache, as a token's is in key/value;
  // tokens lie their row strides apart there.
  const int64_t elem = dtype_size(key.dtype), row_bytes = key.size(1) * key.size(2) * elem;
  const int64_t k_stride = key.row_stride() * elem, v_stride = value.row_stride() * elem;
  const int64_t* slots = slot_mapping.ptr<const int64_t>();
  const char* k = key.ptr<const char>();
  const char* v = value.ptr<const char>();
  char* kc = key_cache.ptr<char>();
  char* vc = value_cache.ptr<char>();
  parallel_for(key.size(0), std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(row_bytes, 1)),
               [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      if (slot < 0) continue;  // padding
      std::memcpy(kc + slot * row_bytes, k + t * k_stride, row_bytes);
      std::memcpy(vc + slot * row_bytes, v + t * v_stride, row_bytes);
    }
  });
}

namespace {

constexpr int64_t kKeyTile = 32;        // keys scored together; the scores of one tile per row
constexpr int64_t kRowsPerTile = 64;    // (query, head) rows per prefill work item
// ... on AMX tiles, where the products cost little against reading the item's keys and values
constexpr int64_t kAmxRowsPerTile = 256;
constexpr int64_t kMinSplitKeys = 64;   // a key-range split is never shorter than this
// A thread keeps at most this many bytes of packed key tiles (PackedKeys: 8K keys of bf16 K and
// V at head dim 128); later tiles of a longer key range are packed for each item that reads them.
constexpr int64_t kMaxPackedBytes = int64_t{4} << 20;

// Decode tiles run on 16-float vectors in every clone (one zmm, two ymm, four xmm).
using f32x16 = Wide::F;
using i32x16 = Wide::I;
using f32x8 = Narrow::F;
constexpr int64_t kLanes = 16;

// The sums of eight vectors, lane i of `out` for a[i].
GNOMON_INLINE void reduce_add8(f32x8& out, const f32x16 (&a)[8]) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
  // A butterfly of two-source shuffles: about 3 instructions per vector instead of ~10 for a
  // reduction of each. Level by level, each vector's partial sums fold into half as many lanes.
  f32x16 b[4], c[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                   19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                   19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                   22, 23, 28, 29, 30, 31);
  }
  const f32x16 d = __builtin_shufflevector(c[0], c[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21,
                                           24, 25, 28, 29) +
                   __builtin_shufflevector(c[0], c[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22,
                                           23, 26, 27, 30, 31);
  out = __builtin_shufflevector(d, d, 0, 2, 4, 6, 8, 10, 12, 14) +
        __builtin_shufflevector(d, d, 1, 3, 5, 7, 9, 11, 13, 15);
#else
  for (int i = 0; i < 8; ++i) out[i] = reduce_add(a[i]);
#endif
}

// A tile's work is two passes over the rows of one work item (one KV head's rows): score_tile
// writes each row's scores against the tile's keys, update_tile folds them into the row's online
// softmax and value accumulator. Row r sees keys [lo[r], hi[r]) of the tile (n <= kKeyTile
// keys). Score rows have kKeyTile floats; lanes outside [lo, hi) hold anything and are masked.

// Float rows are padded to `chunks` * 16 floats (zeros past head_dim). q is already multiplied by
// the scale; k[j] is key j's padded float row, readable for every j < kKeyTile. kChunks > 0
// fixes `chunks` at compile time, so a row's query lives in registers.
template <int kChunks>
GNOMON_INLINE void score_tile_impl(int64_t chunks_at_run_time, int64_t rows, const float* q,
                                      const float* const* k, const int32_t* lo,
                                      const int32_t* hi, float* scores) {
  constexpr int kMaxChunks = kChunks > 0 ? kChunks : static_cast<int>(kMaxHeadDim / kLanes);
  const int64_t chunks = kChunks > 0 ? kChunks : chunks_at_run_time;
  for (int64_t r = 0; r < rows; ++r) {
    f32x16 qv[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) qv[c] = load<f32x16>(q + r * chunks * kLanes + c * kLanes);
    // Eight keys at a time: independent accumulation chains, one butterfly reduction.
    for (int64_t j = lo[r] & ~int32_t{7}; j < hi[r]; j += 8) {
      f32x16 a[8] = {}, kv;
      for (int64_t c = 0; c < chunks; ++c) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          kv = load<f32x16>(k[j + i] + c * kLanes);
          a[i] += qv[c] * kv;
        }
      }
      f32x8 sums;
      reduce_add8(sums, a);
      std::memcpy(scores + r * kKeyTile + j, &sums, sizeof(sums));
    }
  }
}

GNOMON_SIMD_CLONES void score_tile(int64_t chunks, int64_t rows, const float* q,
                                   const float* const* k, const int32_t* lo, const int32_t* hi,
                                   float* scores) {
  switch (chunks) {
    case 4: return score_tile_impl<4>(chunks, rows, q, k, lo, hi, scores);  // head dim 64
    case 8: return score_tile_impl<8>(chunks, rows, q, k, lo, hi, scores);  // head dim 128
    default: return score_tile_impl<0>(chunks, rows, q, k, lo, hi, scores);
  }
}

// Row r's block softmax over its scores is merged into state[r], and the weighted value rows
// v[j] (padded float rows) are added into its acc row (stride chunks * 16), which lives in
// registers when kChunks fixes `chunks`.
template <int kChunks>
GNOMON_INLINE void update_tile_impl(int64_t chunks_at_run_time, int64_t rows,
                                       const float* const* v, const int32_t* lo,
                                       const int32_t* hi, float* scores,
                                       math::OnlineSoftmax* state, float* acc) {
  constexpr int kMaxChunks = kChunks > 0 ? kChunks : static_cast<int>(kMaxHeadDim / kLanes);
  constexpr int kVectors = static_cast<int>(kKeyTile / kLanes);
  static_assert(kKeyTile % kLanes == 0, "whole score vectors per tile");
  const int64_t chunks = kChunks > 0 ? kChunks : chunks_at_run_time;
  i32x16 lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  f32x16 neg_inf = {};
  neg_inf -= std::numeric_limits<float>::infinity();

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = lo[r], last = hi[r];
    if (first >= last) continue;
    float* s = scores + r * kKeyTile;
    f32x16 sv[kVectors], m = neg_inf;
#pragma GCC unroll 8
    for (int u = 0; u < kVectors; ++u) {
      sv[u] = load<f32x16>(s + u * kLanes);
      const i32x16 index = lane + u * static_cast<int32_t>(kLanes);
      sv[u] = select((index >= static_cast<int32_t>(first)) & (index < static_cast<int32_t>(last)),
             sv[u], neg_inf);
      m = max(m, sv[u]);
    }
    const float block_max = reduce_max(m);
    if (block_max == kNegInf) continue;  // every score -inf: nothing to add
    f32x16 total = {};
#pragma GCC unroll 8
    for (int u = 0; u < kVectors; ++u) {
      sv[u] = exp_nonpositive<Wide>(sv[u] - block_max);
      total += sv[u];
    }
    float acc_scale, block_scale;
    state[r].merge(math::OnlineSoftmax{block_max, reduce_add(total)}, acc_scale, block_scale);
#pragma GCC unroll 8
    for (int u = 0; u < kVectors; ++u) store(s + u * kLanes, sv[u] * block_scale);

    f32x16 av[kMaxChunks], vv;
    float* acc_row = acc + r * chunks * kLanes;
    for (int64_t c = 0; c < chunks; ++c) {
      av[c] = load<f32x16>(acc_row + c * kLanes);
      av[c] *= acc_scale;
    }
    for (int64_t j = first; j < last; ++j) {
      const float w = s[j];
      for (int64_t c = 0; c < chunks; ++c) {
        vv = load<f32x16>(v[j] + c * kLanes);
        av[c] += w * vv;
      }
    }
    for (int64_t c = 0; c < chunks; ++c) store(acc_row + c * kLanes, av[c]);
  }
}

GNOMON_SIMD_CLONES void update_tile(int64_t chunks, int64_t rows, const float* const* v,
                                    const int32_t* lo, const int32_t* hi, float* scores,
                                    math::OnlineSoftmax* state, float* acc) {
  switch (chunks) {
    case 4: return update_tile_impl<4>(chunks, rows, v, lo, hi, scores, state, acc);
    case 8: return update_tile_impl<8>(chunks, rows, v, lo, hi, scores, state, acc);
    default: return update_tile_impl<0>(chunks, rows, v, lo, hi, scores, state, acc);
  }
}

#if GNOMON_HAS_WIDE_KERNELS
// Scores straight from bfloat16 rows with AVX512-BF16 dot products (vdpbf16ps: two products
// per float lane, each exact, summed in float32): no key is converted to float, and a
// dot costs half the instructions. `q` rows are the unscaled bf16 queries, `pairs` * 32 elements
// long (the head dim, a multiple of 32); k[j] points at key j's bf16 row in the cache.

template <int kPairs>
GNOMON_TARGET_BF16 GNOMON_INLINE void score_tile_bf16_impl(int64_t pairs_at_run_time,
                                                           int64_t rows, const uint16_t* q,
                                                           const uint16_t* const* k,
                                                           const int32_t* lo, const int32_t* hi,
                                                           float scale, float* scores) {
  constexpr int kMaxPairs = kPairs > 0 ? kPairs : static_cast<int>(kMaxHeadDim / 32);
  const int64_t pairs = kPairs > 0 ? kPairs : pairs_at_run_time;
  for (int64_t r = 0; r < rows; ++r) {
    __m512bh qv[kMaxPairs];
    for (int64_t c = 0; c < pairs; ++c) {
      qv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(q + r * pairs * 32 + c * 32));
    }
    for (int64_t j = lo[r] & ~int32_t{7}; j < hi[r]; j += 8) {
      __m512 a[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) a[i] = _mm512_setzero_ps();
      for (int64_t c = 0; c < pairs; ++c) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m512bh kv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(k[j + i] + c * 32));
          a[i] = _mm512_dpbf16_ps(a[i], qv[c], kv);
        }
      }
      f32x16 partial[8];
      std::memcpy(partial, a, sizeof(partial));
      f32x8 sums;
      reduce_add8(sums, partial);
      sums *= scale;
      std::memcpy(scores + r * kKeyTile + j, &sums, sizeof(sums));
    }
  }
}

GNOMON_TARGET_BF16 void score_tile_bf16(int64_t pairs, int64_t rows, const uint16_t* q,
                                     const uint16_t* const* k, const int32_t* lo,
                                     const int32_t* hi, float scale, float* scores) {
  switch (pairs) {
    case 2: return score_tile_bf16_impl<2>(pairs, rows, q, k, lo, hi, scale, scores);
    case 4: return score_tile_bf16_impl<4>(pairs, rows, q, k, lo, hi, scale, scores);
    default: return score_tile_bf16_impl<0>(pairs, rows, q, k, lo, hi, scale, scores);
  }
}

#endif

// The call's geometry, shared by every work item.
struct Geometry {
  const char* query;
  int64_t query_token_stride;  // elements from one token's query heads to the next's
  const char* key_cache;
  const char* value_cache;
  DType dtype;
  int64_t elem;  // bytes per element
  int64_t num_heads, num_kv_heads, group, head_dim, block_size;
  int64_t chunks;  // head_dim in 16-float chunks, rounded up; float rows are padded to this
  const int32_t* block_tables;
  int64_t max_blocks;
  const float* sinks;  // nullptr: none
  float scale;
  int64_t window;  // 0: none
  Isa isa;         // the kernel family this call runs
  bool bf16_dot;   // bfloat16 scores by AVX512-BF16 dot products
  int64_t call;    // this call's number in the process: what a thread packed in another is stale

  int64_t padded() const { return chunks * kLanes; }
};

// Queries [first, first + count) of one sequence (token index `token` of the first, at key
// position `pos`) with KV heads [g0, g0 + heads) against keys [k0, k1). Its rows are ordered
// (KV head, query, head of the group), so each KV head's rows are one run. `partial` >= 0 places
// the item's unnormalised result in the split scratch; -1 means the item covers the whole key
// range and writes `out` directly.
struct Item {
  int64_t b, g0, heads, token, pos, count, k0, k1;
  int64_t partial;
  int64_t cost() const { return heads * count * (k1 - k0); }
};

// A tile whose key range was split over several items, merged after they all ran.
struct SplitTile {
  Item tile;
  int64_t splits;
};

// The key tiles of one group of lanes items (call, sequence, first KV head and head count, first
// key), each in the layout its kernel family reads: keys dense, values paired or converted. The
// group's items, one per tile of queries, read the same keys and run one after another, so a
// thread packs each tile once for all of those it runs.
struct PackedKeys {
  int64_t call = -1, b = 0, g0 = 0, heads = 0, k0 = 0;
  std::vector<int64_t> counts;  // the keys packed in each tile (0: none yet)
  AlignedVector<float> tiles;   // [tile][head][slot floats]
};

// Per-thread scratch, grown on demand and kept for the next call.
struct Scratch {
  std::vector<float> q, acc, keys, values, scores;
  AlignedVector<float> lanes, tiles;  // the lanes path's per-head and per-tile buffers
  PackedKeys packed;
  std::vector<uint16_t> q_bf16;
  std::vector<math::OnlineSoftmax> state;
  std::vector<int32_t> lo, hi;
  std::vector<const float*> k_rows, v_rows;
  std::vector<const uint16_t*> k_rows_bf16;
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Normalises an item's rows of `acc` (padded stride) by their softmax state, after the sink
// logits (when present) join the denominators, and stores them to `out`.
void finish_rows(const Geometry& geo, const Item& item, math::OnlineSoftmax* state, float* acc,
                 const TensorView& out) {
  const int64_t d = geo.head_dim, stride = geo.padded(), group = geo.group;
  const int64_t rows = item.heads * item.count * group;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = item.g0 + r / (item.count * group), i = r / group % item.count;
    const int64_t head = g * group + r % group;
    float acc_scale = 1.0f, unused;
    if (geo.sinks != nullptr) {
      state[r].merge(math::OnlineSoftmax{geo.sinks[head], 1.0f}, acc_scale, unused);
    }
    const float inv = state[r].sum > 0.0f ? acc_scale / state[r].sum : 0.0f;
    float* row = acc + r * stride;
    scale(inv, row, d);
    store_floats(row, out.dtype,
                 out.ptr<char>() + ((item.token + i) * geo.num_heads + head) * d * geo.elem, d);
  }
}

// An item's rows (sc.state, sc.acc) as a partial result of a split, or normalised into `out`.
void emit_item(const Geometry& geo, const Item& item, Scratch& sc, const TensorView& out,
               float* partials) {
  const int64_t d = geo.head_dim, stride = geo.padded();
  if (item.partial >= 0) {
    // Layout per row: max, sum, then the head_dim unnormalised outputs.
    float* p = partials + item.partial;
    const int64_t rows = item.heads * item.count * geo.group;
    for (int64_t r = 0; r < rows; ++r, p += d + 2) {
      p[0] = sc.state[r].max;
      p[1] = sc.state[r].sum;
      std::memcpy(p + 2, sc.acc.data() + r * stride, d * sizeof(float));
    }
    return;
  }
  finish_rows(geo, item, sc.state.data(), sc.acc.data(), out);
}

// A key's rows for the item's heads are one contiguous run in the cache, at this element.
int64_t key_element(const Geometry& geo, const Item& item, int64_t key) {
  const int32_t* table = geo.block_tables + item.b * geo.max_blocks;
  return (table[key / geo.block_size] * geo.block_size + key % geo.block_size) *
             geo.num_kv_heads * geo.head_dim +
         item.g0 * geo.head_dim;
}

// The rows of tile [kb, kb + n) each (query, head) row of an item sees: query i sees keys
// [pos - window + 1, pos]. Every KV head's rows see the same ranges.
bool key_ranges(const Geometry& geo, const Item& item, int64_t kb, int64_t n, int32_t* lo,
                int32_t* hi) {
  bool partial = false;
  for (int64_t i = 0; i < item.count; ++i) {
    const int64_t pos = item.pos + i;
    const int64_t first = std::max<int64_t>(0, geo.window > 0 ? pos - geo.window + 1 - kb : 0);
    const int64_t last = std::max(first, std::min<int64_t>(n, pos + 1 - kb));
    partial = partial || first > 0 || last < n;
    for (int64_t h = 0; h < geo.group; ++h) {
      lo[i * geo.group + h] = static_cast<int32_t>(first);
      hi[i * geo.group + h] = static_cast<int32_t>(last);
    }
  }
  return partial;
}

void run_item_lanes(const Geometry& geo, const Item& item, const TensorView& out,
                    float* partials) {
  const int64_t d = geo.head_dim, stride = geo.padded(), heads = item.heads;
  const int64_t head_rows = item.count * geo.group;
  const bool dot = has_bf16_dot(geo.isa) && geo.dtype == DType::BFloat16 && d % 2 == 0;
  const int64_t vector = geo.isa == Isa::Narrow ? Narrow::L : Wide::L;
  const int64_t lanes = (head_rows + vector - 1) / vector * vector;
  // Rows of Q^T, O^T and the scores a whole number of KB apart would fall in a quarter of the L1
  // sets or fewer (the sets repeat every 4 KB), so such rows get a spare cache line
  const int64_t ld = lanes * sizeof(float) % 1024 == 0 ? lanes + 16 : lanes;
  Scratch& sc = thread_scratch();
  // Per head: Q^T, O^T [d][ld], max and sum [lanes]. Per head and tile: scores [kLanesKeys][ld],
  // P pairs [kLanesKeys / 2][ld], alpha [lanes].
  const int64_t head_floats = 2 * d * ld + 2 * lanes;
  const int64_t tile_floats = kLanesKeys * ld + kLanesKeys / 2 * ld + lanes;
  sc.lanes.assign(heads * head_floats, 0.0f);
  sc.q.resize(head_rows * stride);  // a head's query rows, padded
  sc.tiles.assign(heads * tile_floats, 0.0f);
  sc.lo.assign(lanes, 0);
  sc.hi.assign(lanes, 0);
  std::vector<LanesHead> head(heads);
  std::vector<LanesTile> tile(heads);
  for (int64_t h = 0; h < heads; ++h) {
    float* base = sc.lanes.data() + h * head_floats;
    head[h] = LanesHead{lanes, ld, base, base + d * ld, base + 2 * d * ld,
                        base + 2 * d * ld + lanes};
    std::fill(head[h].max, head[h].max + lanes, kNegInf);
    float* scores = sc.tiles.data() + h * tile_floats;
    tile[h] = LanesTile{nullptr, nullptr, scores,
                        reinterpret_cast<uint32_t*>(scores + kLanesKeys * ld),
                        scores + kLanesKeys * ld + kLanesKeys / 2 * ld, sc.lo.data(),
                        sc.hi.data(), 0, d, geo.scale, false};
    // Q^T: head dims (or, for the dot path, pairs of them) down, rows across
    for (int64_t r = 0; r < head_rows; ++r) {
      const int64_t i = r / geo.group, g = item.g0 + h;
      const char* q = geo.query + ((item.token + i) * geo.query_token_stride +
                                   (g * geo.group + r % geo.group) * d) *
                                      geo.elem;
      if (dot) {
        std::memcpy(sc.q.data() + r * stride, q, d * 2);
      } else {
        load_floats(q, geo.dtype, sc.q.data() + r * stride, d);
      }
    }
    transpose_words(geo.isa, sc.q.data(), head_rows, dot ? d / 2 : d, stride, head[h].qt, ld);
  }

  // The group's key tiles, packed by the first of its items this thread runs: a slot per tile
  // and head holds the keys (key_floats), then the values. Tiles from `kept` on share one slot.
  PackedKeys& packed = sc.packed;
  if (packed.call != geo.call || packed.b != item.b || packed.g0 != item.g0 ||
      packed.heads != heads || packed.k0 != item.k0) {
    packed.call = geo.call, packed.b = item.b, packed.g0 = item.g0, packed.heads = heads;
    packed.k0 = item.k0;
    packed.counts.clear();
  }
  const int64_t key_floats = kLanesKeys * d / (dot ? 2 : 1), slot_floats = 2 * key_floats;
  const int64_t key_tiles = (item.k1 - item.k0 + kLanesKeys - 1) / kLanesKeys;
  const int64_t kept = std::min<int64_t>(
      key_tiles, kMaxPackedBytes / (heads * slot_floats * sizeof(float)));
  if (static_cast<int64_t>(packed.counts.size()) < kept) packed.counts.resize(kept, 0);
  packed.tiles.resize(std::max<size_t>(packed.tiles.size(), (kept + 1) * heads * slot_floats));
  auto keys_in = [&](int64_t t) {
    return std::min(kLanesKeys, item.k1 - item.k0 - t * kLanesKeys);
  };
  auto is_packed = [&](int64_t t) { return t < kept && packed.counts[t] == keys_in(t); };

  // Each key's cache element (of the item's first KV head), for a tile and the next
  int64_t element_buffers[2][kLanesKeys];
  int64_t* elements = element_buffers[0];
  int64_t* next_elements = element_buffers[1];
  int64_t next_tile = -1;  // the tile whose elements next_elements holds
  auto tile_elements = [&](int64_t t, int64_t* out) {
    const int64_t kb = item.k0 + t * kLanesKeys, count = std::max<int64_t>(0, keys_in(t));
    for (int64_t j = 0; j < count; ++j) out[j] = key_element(geo, item, kb + j);
    return count;
  };
  std::vector<const uint16_t*> value_rows(kLanesKeys);
  auto pack = [&](int64_t t, float* slots) {
    if (next_tile != t) tile_elements(t, next_elements);
    std::swap(elements, next_elements);
    // the next tile's rows (scattered over the blocks) are fetched while this one is packed
    const int64_t next_n = is_packed(t + 1) ? 0 : tile_elements(t + 1, next_elements);
    next_tile = next_n > 0 ? t + 1 : -1;
    const int64_t n = keys_in(t), key_bytes = d * (dot ? 2 : 4);
    for (int64_t h = 0; h < heads; ++h) {
      float* slot = slots + h * slot_floats;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t element = elements[j] + h * d;
        const char* k = geo.key_cache + element * geo.elem;
        const char* v = geo.value_cache + element * geo.elem;
        if (j < next_n) {
          const int64_t next = (next_elements[j] + h * d) * geo.elem;
          for (int64_t line = 0; line < d * geo.elem; line += 64) {
            __builtin_prefetch(geo.key_cache + next + line);
            __builtin_prefetch(geo.value_cache + next + line);
          }
        }
        if (dot) {
          std::memcpy(reinterpret_cast<char*>(slot) + j * key_bytes, k, key_bytes);
          value_rows[j] = reinterpret_cast<const uint16_t*>(v);
        } else {
          load_floats(k, geo.dtype, slot + j * d, d);
          load_floats(v, geo.dtype, slot + key_floats + j * d, d);
        }
      }
      if (dot) pair_values(geo.isa, geo.bf16_dot, value_rows.data(), n, d, slot + key_floats);
    }
    if (t < kept) packed.counts[t] = n;
  };

  for (int64_t t = 0; t < key_tiles; ++t) {
    const int64_t kb = item.k0 + t * kLanesKeys, n = keys_in(t);
    float* slots = packed.tiles.data() + std::min(t, kept) * heads * slot_floats;
    if (!is_packed(t)) pack(t, slots);
    const bool masked = key_ranges(geo, item, kb, n, sc.lo.data(), sc.hi.data());
    for (int64_t h = 0; h < heads; ++h) {
      LanesTile& lt = tile[h];
      lt.keys = slots + h * slot_floats;
      lt.values = slots + h * slot_floats + key_floats;
      lt.n = n;
      lt.masked = masked;
      run_lanes_tile(geo.isa, geo.bf16_dot, dot, head[h], lt);
    }
  }

  const int64_t rows = heads * head_rows;
  sc.acc.assign(rows * stride, 0.0f);
  sc.state.resize(rows);
  for (int64_t h = 0; h < heads; ++h) {
    transpose_words(geo.isa, head[h].ot, d, head_rows, ld,
                    sc.acc.data() + h * head_rows * stride, stride);
    for (int64_t r = 0; r < head_rows; ++r) {
      sc.state[h * head_rows + r] = math::OnlineSoftmax{head[h].max[r], head[h].sum[r]};
    }
  }
  emit_item(geo, item, sc, out, partials);
}

void run_item(const Geometry& geo, const Item& item, const TensorView& out, float* partials) {
  if (item.count * geo.group >= kLanesMinRows) return run_item_lanes(geo, item, out, partials);
  const int64_t d = geo.head_dim, stride = geo.padded(), group = geo.group;
  const int64_t heads = item.heads, head_rows = item.count * group, rows = heads * head_rows;
  // float32 rows with no padding are read in place; bfloat16 keys are read in place by the
  // AVX512-BF16 scores; every other row is converted to a padded float row in the scratch.
  const bool f32_in_place = geo.dtype == DType::Float32 && d == stride;
  const bool bf16_dot = geo.bf16_dot;
  const bool keys_in_place = f32_in_place || bf16_dot;
  Scratch& sc = thread_scratch();
  sc.acc.assign(rows * stride, 0.0f);
  sc.state.assign(rows, math::OnlineSoftmax{});
  sc.scores.resize(head_rows * kKeyTile);
  sc.lo.resize(head_rows);
  sc.hi.resize(head_rows);
  sc.k_rows.resize(heads * kKeyTile);
  sc.v_rows.resize(heads * kKeyTile);
  sc.k_rows_bf16.resize(heads * kKeyTile);
  // Converted rows are [head][key][stride]: one head's tile is contiguous (a stride of `heads`
  // rows between keys would alias in the L1 sets). Padding, when there is some, stays zero.
  auto prepare = [&](std::vector<float>& buffer, std::vector<const float*>& row_ptrs) {
    if (d == stride) {
      buffer.resize(heads * kKeyTile * stride);
    } else {
      buffer.assign(heads * kKeyTile * stride, 0.0f);
    }
    for (int64_t j = 0; j < heads * kKeyTile; ++j) row_ptrs[j] = buffer.data() + j * stride;
  };
  if (!keys_in_place) prepare(sc.keys, sc.k_rows);
  if (!f32_in_place) prepare(sc.values, sc.v_rows);

  // Row r is head r % group of query r / group % count, of KV head g0 + r / head_rows.
  auto query_row = [&](int64_t r) {
    const int64_t g = item.g0 + r / head_rows, i = r / group % item.count;
    return geo.query +
           ((item.token + i) * geo.query_token_stride + (g * group + r % group) * d) * geo.elem;
  };
  if (bf16_dot) {
    sc.q_bf16.resize(rows * d);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(sc.q_bf16.data() + r * d, query_row(r), d * 2);
  } else {
    sc.q.assign(rows * stride, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      load_floats(query_row(r), geo.dtype, sc.q.data() + r * stride, d);
      scale(geo.scale, sc.q.data() + r * stride, d);
    }
  }

  // A key's rows for the item's heads are one contiguous run in the cache.
  for (int64_t kb = item.k0; kb < item.k1; kb += kKeyTile) {
    const int64_t n = std::min(kKeyTile, item.k1 - kb);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t element = key_element(geo, item, kb + j);
      const char* k = geo.key_cache + element * geo.elem;
      const char* v = geo.value_cache + element * geo.elem;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t slot = h * kKeyTile + j, head_bytes = h * d * geo.elem;
        if (bf16_dot) {
          sc.k_rows_bf16[slot] = reinterpret_cast<const uint16_t*>(k + head_bytes);
        } else if (f32_in_place) {
          sc.k_rows[slot] = reinterpret_cast<const float*>(k + head_bytes);
        } else {
          load_floats(k + head_bytes, geo.dtype, sc.keys.data() + slot * stride, d);
        }
        if (f32_in_place) {
          sc.v_rows[slot] = reinterpret_cast<const float*>(v + head_bytes);
        } else {
          load_floats(v + head_bytes, geo.dtype, sc.values.data() + slot * stride, d);
        }
      }
    }
    if (keys_in_place) {  // the scores read (and then mask) groups of 8 keys up to kKeyTile
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = h * kKeyTile + n; j < (h + 1) * kKeyTile; ++j) {
          if (bf16_dot) {
            sc.k_rows_bf16[j] = sc.k_rows_bf16[h * kKeyTile];
          } else {
            sc.k_rows[j] = sc.k_rows[h * kKeyTile];
          }
        }
      }
    }
    key_ranges(geo, item, kb, n, sc.lo.data(), sc.hi.data());
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r = h * head_rows;
#if GNOMON_HAS_WIDE_KERNELS
      if (bf16_dot) {
        score_tile_bf16(d / 32, head_rows, sc.q_bf16.data() + r * d,
                        sc.k_rows_bf16.data() + h * kKeyTile, sc.lo.data(), sc.hi.data(),
                        geo.scale, sc.scores.data());
      } else
#endif
      {
        score_tile(geo.chunks, head_rows, sc.q.data() + r * stride,
                   sc.k_rows.data() + h * kKeyTile, sc.lo.data(), sc.hi.data(),
                   sc.scores.data());
      }
      update_tile(geo.chunks, head_rows, sc.v_rows.data() + h * kKeyTile, sc.lo.data(),
                  sc.hi.data(), sc.scores.data(), sc.state.data() + r, sc.acc.data() + r * stride);
    }
  }

  emit_item(geo, item, sc, out, partials);
}

void merge_splits(const Geometry& geo, const SplitTile& split, const TensorView& out,
                  const float* partials) {
  const int64_t d = geo.head_dim, stride = geo.padded();
  const int64_t rows = split.tile.heads * split.tile.count * geo.group;
  Scratch& sc = thread_scratch();
  sc.acc.assign(rows * stride, 0.0f);
  sc.state.assign(rows, math::OnlineSoftmax{});
  for (int64_t s = 0; s < split.splits; ++s) {
    const float* p = partials + split.tile.partial + s * rows * (d + 2);
    for (int64_t r = 0; r < rows; ++r, p += d + 2) {
      float acc_scale, part_scale;
      sc.state[r].merge(math::OnlineSoftmax{p[0], p[1]}, acc_scale, part_scale);
      float* acc = sc.acc.data() + r * stride;
      scale(acc_scale, acc, d);
      axpy(part_scale, p + 2, acc, d);
    }
  }
  finish_rows(geo, split.tile, sc.state.data(), sc.acc.data(), out);
}

}  // namespace

void paged_attention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_tables,
                     const TensorView& seq_lens, const TensorView& query_start_loc, double scale,
                     int64_t sliding_window, const TensorView* sinks) {
  if (out.numel() == 0) return;  // no query tokens, or no heads (then group would be 0)
  Geometry geo;
  geo.query = query.ptr<const char>();
  geo.query_token_stride = query.row_stride();
  geo.key_cache = key_cache.ptr<const char>();
  geo.value_cache = value_cache.ptr<const char>();
  geo.dtype = query.dtype;
  geo.elem = dtype_size(query.dtype);
  geo.num_heads = query.size(1);
  geo.num_kv_heads = key_cache.size(2);
  geo.group = geo.num_heads / geo.num_kv_heads;
  geo.head_dim = query.size(2);
  geo.chunks = (geo.head_dim + kLanes - 1) / kLanes;
  geo.block_size = key_cache.size(1);
  geo.block_tables = block_tables.ptr<const int32_t>();
  geo.max_blocks = block_tables.size(1);
  geo.sinks = sinks != nullptr ? sinks->ptr<const float>() : nullptr;
  geo.scale = static_cast<float>(scale);
  geo.window = sliding_window;
  geo.isa = kernel_isa();
  geo.bf16_dot = has_bf16_dot(geo.isa) && geo.dtype == DType::BFloat16 &&
                 geo.head_dim % 32 == 0;
  static std::atomic<int64_t> calls{0};
  geo.call = calls++;

  const int64_t batch = seq_lens.size(0);
  const int32_t* lens = seq_lens.ptr<const int32_t>();
  const int32_t* starts = query_start_loc.ptr<const int32_t>();

  // Tiles of up to kRowsPerTile rows (kAmxRowsPerTile on AMX): a prefill tile is several queries
  // of one KV head; a decode tile is one query (or a few) over as many KV heads as fit, so that
  // it reads each key's rows of those heads as one contiguous run.
  const bool amx = geo.isa == Isa::Amx && geo.bf16_dot;
  const int64_t rows_per_tile = amx ? kAmxRowsPerTile : kRowsPerTile;
  const int64_t queries_per_tile = std::max<int64_t>(1, rows_per_tile / geo.group);
  std::vector<Item> tiles;
  int64_t total_cost = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = starts[b + 1] - starts[b];
    for (int64_t first = 0; first < q_len; first += queries_per_tile) {
      const int64_t count = std::min(queries_per_tile, q_len - first);
      const int64_t heads = std::clamp<int64_t>(rows_per_tile / (count * geo.group), 1,
                                                geo.num_kv_heads);
      const int64_t pos = lens[b] - q_len + first;
      const int64_t k0 = geo.window > 0 ? std::max<int64_t>(0, pos - geo.window + 1) : 0;
      const int64_t k1 = pos + count;
      for (int64_t g0 = 0; g0 < geo.num_kv_heads; g0 += heads) {
        tiles.push_back(Item{b, g0, std::min(heads, geo.num_kv_heads - g0), starts[b] + first,
                             pos, count, k0, k1, -1});
        total_cost += tiles.back().cost();
      }
    }
  }
  if (tiles.empty()) return;

  // Split long key ranges until there are about four items per thread, none shorter than
  // kMinSplitKeys keys.
  const int64_t threads = num_threads();
  const int64_t target_cost = std::max<int64_t>(1, total_cost / (4 * threads));
  std::vector<Item> items;
  std::vector<SplitTile> splits;
  int64_t partial_floats = 0;
  for (const Item& tile : tiles) {
    const int64_t keys = tile.k1 - tile.k0, width = tile.heads * tile.count;
    const int64_t chunk = std::max<int64_t>(kMinSplitKeys, (target_cost + width - 1) / width);
    const int64_t parts = (keys + chunk - 1) / chunk;
    if (parts <= 1) {
      items.push_back(tile);
      continue;
    }
    Item merged = tile;
    merged.partial = partial_floats;
    splits.push_back(SplitTile{merged, parts});
    // (parts - 1) * step < keys, so no part is empty.
    const int64_t step = (keys + parts - 1) / parts;
    for (int64_t s = 0; s < parts; ++s) {
      Item part = tile;
      part.k0 = tile.k0 + s * step;
      part.k1 = std::min(tile.k1, part.k0 + step);
      part.partial = partial_floats;
      partial_floats += width * geo.group * (geo.head_dim + 2);
      items.push_back(part);
    }
  }
  // Items that read the same keys (a sequence's KV heads) run one after another, so that a
  // thread finds the keys still in its cache; the costliest groups first, and the costliest
  // items first within a group, so that the dynamic hand-out ends evenly.
  std::vector<int64_t> group_cost(batch * geo.num_kv_heads);
  auto group = [&](const Item& item) { return item.b * geo.num_kv_heads + item.g0; };
  for (const Item& item : items) group_cost[group(item)] += item.cost();
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  auto rank = [&](int64_t i) {
    const int64_t g = group(items[i]);
    return std::make_tuple(-group_cost[g], g, -items[i].cost());
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return rank(a) < rank(b); });

  std::vector<float> partials(partial_floats);
  // One item at a time (ItemQueue): each thread runs its share of the groups in order, and a
  // thread done early takes single items, not a fourth of another thread's share
  ItemQueue queue(static_cast<int64_t>(items.size()));
  parallel_for(queue.tickets(), 1, [&](int64_t ticket, int64_t) {
    for (int64_t i; queue.take(ticket, i);) run_item(geo, items[order[i]], out, partials.data());
  });
  parallel_for(static_cast<int64_t>(splits.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) merge_splits(geo, splits[i], out, partials.data());
  });
}

}  // namespace gnomon::cpu
