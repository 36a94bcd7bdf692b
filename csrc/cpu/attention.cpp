// reshape_and_cache and paged_attention.
//
// paged_attention splits a call into work items: (sequence, KV head, tile of queries, range of
// keys). Every query head of the KV head's group is in the item, so each K/V row is read and
// converted to float once per group. A tile holds up to kRowsPerTile (query, head) rows; decode
// tiles hold one query. The keys are walked in tiles of kKeyTile through the block table, with
// an online softmax per row (the scores of one key tile at a time, never a [q, kv] matrix). When
// the items are too few to keep every thread busy (decode with few sequences and long contexts)
// the key range of each tile is split, the splits write partial softmaxes (max, sum, unnormalised
// output), and a second pass merges them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/parallel.h"
#include "core/scalar_math.h"
#include "core/simd.h"
#include "core/threads.h"
#include "cpu/kernels.h"
#include "cpu/vec.h"

namespace gnomon::cpu {

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping) {
  // A slot's row of Hkv * D elements is contiguous in the cache, as a token's is in key/value.
  const int64_t row_bytes = key.size(1) * key.size(2) * dtype_size(key.dtype);
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
      std::memcpy(kc + slot * row_bytes, k + t * row_bytes, row_bytes);
      std::memcpy(vc + slot * row_bytes, v + t * row_bytes, row_bytes);
    }
  });
}

namespace {

constexpr int64_t kKeyTile = 32;        // keys scored together; the scores of one tile per row
constexpr int64_t kRowsPerTile = 64;    // (query, head) rows per prefill work item
constexpr int64_t kMinSplitKeys = 256;  // a key-range split is never shorter than this
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Fixed-width vectors (GCC/Clang vector extensions): each SIMD clone lowers them to its own
// registers (one zmm, two ymm, four xmm; four NEON registers on arm64). They are only passed by
// reference, so no vector type ever crosses a function ABI.
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
constexpr int64_t kLanes = 16;

// GCC inlines nothing into a SIMD clone across differing target arches unless forced, so every
// helper of the clone below is always_inline (and then compiled once per clone).
#define ATTENTION_INLINE inline __attribute__((always_inline))

ATTENTION_INLINE void load(f32x16& v, const float* p) { std::memcpy(&v, p, sizeof(v)); }
ATTENTION_INLINE void store(float* p, const f32x16& v) { std::memcpy(p, &v, sizeof(v)); }

ATTENTION_INLINE float reduce_add(const f32x16& v) {
  f32x8 lo, hi;
  std::memcpy(&lo, &v, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
  lo += hi;
  f32x4 a, b;
  std::memcpy(&a, &lo, sizeof(a));
  std::memcpy(&b, reinterpret_cast<const char*>(&lo) + sizeof(a), sizeof(b));
  a += b;
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// The sums of eight vectors, lane i of `out` for a[i].
ATTENTION_INLINE void reduce_add8(f32x8& out, const f32x16 (&a)[8]) {
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

// mask ? a : b, lane by lane (mask lanes are all ones or all zeros).
ATTENTION_INLINE void select(f32x16& out, const i32x16& mask, const f32x16& a, const f32x16& b) {
  i32x16 ia, ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  const i32x16 bits = (ia & mask) | (ib & ~mask);
  std::memcpy(&out, &bits, sizeof(out));
}

// e^x lane by lane for x <= 0, no calls or branches: Cody-Waite reduction by ln 2 and the Cephes
// expf polynomial (within 2 ulp of expf). Lanes below -87, -inf included, give 0; NaN stays NaN.
// 2^n comes from the bits of the rounding sum, so no float-to-int conversion is involved.
ATTENTION_INLINE void exp_nonpositive(f32x16& out, const f32x16& x) {
  const i32x16 underflow = x < -87.0f;
  f32x16 xc, floor_value = {};
  floor_value -= 87.0f;
  select(xc, underflow, floor_value, x);
  const f32x16 shifted = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds to int
  const f32x16 n = shifted - 12582912.0f;
  const f32x16 r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  f32x16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  i32x16 bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits - 0x4b400000 + 127) << 23;  // (n + 127) << 23: the float 2^n
  f32x16 two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  const f32x16 zero = {};
  select(out, underflow, zero, p * two_n);
}

// The rows of one work item against one tile of n <= kKeyTile keys. Rows are padded to
// `chunks` * 16 floats (zeros past head_dim): q (already multiplied by the scale) and acc have
// that stride, and k[j] / v[j] point at key j's padded float rows. Row r sees keys
// [lo[r], hi[r]) of the tile; its block softmax is merged into state[r] and its weighted values
// added into its acc row. kChunks > 0 fixes `chunks` at compile time, so a row's query and
// accumulator live in registers.
template <int kChunks>
ATTENTION_INLINE void attend_tile_impl(int64_t chunks_at_run_time, int64_t rows, const float* q,
                             const float* const* k, const float* const* v, const int32_t* lo,
                             const int32_t* hi, math::OnlineSoftmax* state, float* acc) {
  constexpr int kMaxChunks = kChunks > 0 ? kChunks : static_cast<int>(kMaxHeadDim / kLanes);
  const int64_t chunks = kChunks > 0 ? kChunks : chunks_at_run_time;
  const int64_t stride = chunks * kLanes;
  static_assert(kKeyTile == 2 * kLanes, "the score vectors below hold one key tile");
  i32x16 lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  f32x16 neg_inf = {};
  neg_inf -= std::numeric_limits<float>::infinity();

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = lo[r], last = hi[r];
    if (first >= last) continue;
    f32x16 qv[kMaxChunks];
    for (int64_t c = 0; c < chunks; ++c) load(qv[c], q + r * stride + c * kLanes);

    // Scores, eight keys at a time (independent accumulation chains, one butterfly reduction).
    // The group of eight may start before `first` and end past `last`: k[] holds kKeyTile
    // readable rows, and the scores outside [first, last) are masked below.
    alignas(64) float s[kKeyTile] = {};
    for (int64_t j = first & ~int64_t{7}; j < last; j += 8) {
      f32x16 a[8] = {}, kv;
      for (int64_t c = 0; c < chunks; ++c) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          load(kv, k[j + i] + c * kLanes);
          a[i] += qv[c] * kv;
        }
      }
      f32x8 sums;
      reduce_add8(sums, a);
      std::memcpy(s + j, &sums, sizeof(sums));
    }

    // The tile's block softmax over the keys in [first, last); the other lanes weigh 0.
    f32x16 s0, s1;
    load(s0, s);
    load(s1, s + kLanes);
    const i32x16 in0 = (lane >= static_cast<int32_t>(first)) & (lane < static_cast<int32_t>(last));
    const i32x16 in1 = (lane + static_cast<int32_t>(kLanes) >= static_cast<int32_t>(first)) &
                       (lane + static_cast<int32_t>(kLanes) < static_cast<int32_t>(last));
    select(s0, in0, s0, neg_inf);
    select(s1, in1, s1, neg_inf);
    f32x16 m;
    select(m, s0 > s1, s0, s1);
    float block_max = m[0];
    for (int l = 1; l < kLanes; ++l) block_max = m[l] > block_max ? m[l] : block_max;
    if (block_max == -std::numeric_limits<float>::infinity()) continue;  // all scores -inf
    f32x16 p0, p1;
    exp_nonpositive(p0, s0 - block_max);
    exp_nonpositive(p1, s1 - block_max);
    float acc_scale, block_scale;
    state[r].merge(math::OnlineSoftmax{block_max, reduce_add(p0 + p1)}, acc_scale, block_scale);
    store(s, p0 * block_scale);
    store(s + kLanes, p1 * block_scale);

    f32x16 av[kMaxChunks], vv;
    float* acc_row = acc + r * stride;
    for (int64_t c = 0; c < chunks; ++c) {
      load(av[c], acc_row + c * kLanes);
      av[c] *= acc_scale;
    }
    for (int64_t j = first; j < last; ++j) {
      const float w = s[j];
      for (int64_t c = 0; c < chunks; ++c) {
        load(vv, v[j] + c * kLanes);
        av[c] += w * vv;
      }
    }
    for (int64_t c = 0; c < chunks; ++c) store(acc_row + c * kLanes, av[c]);
  }
}

GNOMON_SIMD_CLONES void attend_tile(int64_t chunks, int64_t rows, const float* q,
                                    const float* const* k, const float* const* v,
                                    const int32_t* lo, const int32_t* hi,
                                    math::OnlineSoftmax* state, float* acc) {
  switch (chunks) {
    case 4: return attend_tile_impl<4>(chunks, rows, q, k, v, lo, hi, state, acc);    // D = 64
    case 8: return attend_tile_impl<8>(chunks, rows, q, k, v, lo, hi, state, acc);    // D = 128
    default: return attend_tile_impl<0>(chunks, rows, q, k, v, lo, hi, state, acc);
  }
}

// The call's geometry, shared by every work item.
struct Geometry {
  const char* query;
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

// Per-thread scratch, grown on demand and kept for the next call.
struct Scratch {
  std::vector<float> q, acc, keys, values;
  std::vector<math::OnlineSoftmax> state;
  std::vector<int32_t> lo, hi;
  std::vector<const float*> k_rows, v_rows;
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

void run_item(const Geometry& geo, const Item& item, const TensorView& out, float* partials) {
  const int64_t d = geo.head_dim, stride = geo.padded(), group = geo.group;
  const int64_t heads = item.heads, head_rows = item.count * group, rows = heads * head_rows;
  // float32 rows with no padding are read in place; others are converted into the scratch.
  const bool in_place = geo.dtype == DType::Float32 && d == stride;
  Scratch& sc = thread_scratch();
  sc.q.assign(rows * stride, 0.0f);
  sc.acc.assign(rows * stride, 0.0f);
  sc.state.assign(rows, math::OnlineSoftmax{});
  sc.lo.resize(head_rows);
  sc.hi.resize(head_rows);
  sc.k_rows.resize(heads * kKeyTile);
  sc.v_rows.resize(heads * kKeyTile);
  if (!in_place) {
    // [head][key][stride]: one head's tile is contiguous (a stride of heads rows between keys
    // would alias in the L1 sets).
    if (d == stride) {
      sc.keys.resize(heads * kKeyTile * stride);
      sc.values.resize(heads * kKeyTile * stride);
    } else {
      sc.keys.assign(heads * kKeyTile * stride, 0.0f);  // the padding stays zero
      sc.values.assign(heads * kKeyTile * stride, 0.0f);
    }
    for (int64_t j = 0; j < heads * kKeyTile; ++j) {
      sc.k_rows[j] = sc.keys.data() + j * stride;
      sc.v_rows[j] = sc.values.data() + j * stride;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t g = item.g0 + r / head_rows, i = r / group % item.count;
    const int64_t t = item.token + i, head = g * group + r % group;
    load_floats(geo.query + (t * geo.num_heads + head) * d * geo.elem, geo.dtype,
                sc.q.data() + r * stride, d);
    scale(geo.scale, sc.q.data() + r * stride, d);
  }

  // A key's rows for the item's heads are one contiguous run in the cache.
  const int32_t* table = geo.block_tables + item.b * geo.max_blocks;
  const int64_t token_elems = geo.num_kv_heads * d, run_bytes = heads * d * geo.elem;
  auto element_of = [&](int64_t block, int64_t offset) {
    return (table[block] * geo.block_size + offset) * token_elems + item.g0 * d;
  };
  // Asks for the runs of keys [first, first + n) ahead of use; the runs are scattered through
  // the cache by the block table, which hardware prefetchers cannot follow.
  auto prefetch = [&](int64_t first, int64_t n) {
    int64_t block = first / geo.block_size, offset = first % geo.block_size;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t byte = element_of(block, offset) * geo.elem;
      for (int64_t line = 0; line < run_bytes; line += 64) {
        __builtin_prefetch(geo.key_cache + byte + line);
        __builtin_prefetch(geo.value_cache + byte + line);
      }
      if (++offset == geo.block_size) {
        offset = 0;
        ++block;
      }
    }
  };
  prefetch(item.k0, std::min(kKeyTile, item.k1 - item.k0));
  for (int64_t kb = item.k0; kb < item.k1; kb += kKeyTile) {
    const int64_t n = std::min(kKeyTile, item.k1 - kb);
    if (kb + n < item.k1) prefetch(kb + n, std::min(kKeyTile, item.k1 - kb - n));
    int64_t block = kb / geo.block_size, offset = kb % geo.block_size;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t element = element_of(block, offset);
      const char* k = geo.key_cache + element * geo.elem;
      const char* v = geo.value_cache + element * geo.elem;
      for (int64_t h = 0; h < heads; ++h) {
        if (in_place) {
          sc.k_rows[h * kKeyTile + j] = reinterpret_cast<const float*>(k) + h * d;
          sc.v_rows[h * kKeyTile + j] = reinterpret_cast<const float*>(v) + h * d;
        } else {
          const int64_t row = (h * kKeyTile + j) * stride;
          load_floats(k + h * d * geo.elem, geo.dtype, sc.keys.data() + row, d);
          load_floats(v + h * d * geo.elem, geo.dtype, sc.values.data() + row, d);
        }
      }
      if (++offset == geo.block_size) {
        offset = 0;
        ++block;
      }
    }
    if (in_place) {  // attend_tile may read (and then mask) rows up to kKeyTile
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = n; j < kKeyTile; ++j) sc.k_rows[h * kKeyTile + j] = sc.k_rows[h * kKeyTile];
      }
    }
    // Query i sees keys [pos - window + 1, pos]; the tile holds [kb, kb + n). Every KV head's
    // rows see the same ranges.
    for (int64_t i = 0; i < item.count; ++i) {
      const int64_t pos = item.pos + i;
      const int64_t lo = std::max<int64_t>(0, geo.window > 0 ? pos - geo.window + 1 - kb : 0);
      const int64_t hi = std::max(lo, std::min<int64_t>(n, pos + 1 - kb));
      for (int64_t h = 0; h < group; ++h) {
        sc.lo[i * group + h] = static_cast<int32_t>(lo);
        sc.hi[i * group + h] = static_cast<int32_t>(hi);
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r = h * head_rows;
      attend_tile(geo.chunks, head_rows, sc.q.data() + r * stride, sc.k_rows.data() + h * kKeyTile,
                  sc.v_rows.data() + h * kKeyTile, sc.lo.data(), sc.hi.data(),
                  sc.state.data() + r, sc.acc.data() + r * stride);
    }
  }

  if (item.partial >= 0) {
    // Layout per row: max, sum, then the head_dim unnormalised outputs.
    float* p = partials + item.partial;
    for (int64_t r = 0; r < rows; ++r, p += d + 2) {
      p[0] = sc.state[r].max;
      p[1] = sc.state[r].sum;
      std::memcpy(p + 2, sc.acc.data() + r * stride, d * sizeof(float));
    }
    return;
  }
  finish_rows(geo, item, sc.state.data(), sc.acc.data(), out);
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
  Geometry geo;
  geo.query = query.ptr<const char>();
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

  const int64_t batch = seq_lens.size(0);
  const int32_t* lens = seq_lens.ptr<const int32_t>();
  const int32_t* starts = query_start_loc.ptr<const int32_t>();

  // Tiles of up to kRowsPerTile rows: a prefill tile is several queries of one KV head; a decode
  // tile is one query (or a few) over as many KV heads as fit, so that it reads each key's rows
  // of those heads as one contiguous run.
  const int64_t queries_per_tile = std::max<int64_t>(1, kRowsPerTile / geo.group);
  std::vector<Item> tiles;
  int64_t total_cost = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = starts[b + 1] - starts[b];
    for (int64_t first = 0; first < q_len; first += queries_per_tile) {
      const int64_t count = std::min(queries_per_tile, q_len - first);
      const int64_t heads = std::clamp<int64_t>(kRowsPerTile / (count * geo.group), 1,
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
  // The costliest first, so the dynamic hand-out ends evenly.
  std::vector<int64_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return items[a].cost() > items[b].cost(); });

  std::vector<float> partials(partial_floats);
  parallel_for(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) run_item(geo, items[order[i]], out, partials.data());
  });
  parallel_for(static_cast<int64_t>(splits.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) merge_splits(geo, splits[i], out, partials.data());
  });
}

}  // namespace gnomon::cpu
