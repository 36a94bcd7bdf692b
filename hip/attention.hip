// reshape_and_cache and paged_attention on the GPU: the semantics of csrc/cpu/attention.cpp.
//
// reshape_and_cache: one block per token copies its [Hkv, D] key and value rows to the cache row
// of its slot (a slot's row is contiguous, so slot s starts at element s * Hkv * D). A slot
// outside [0, num_blocks * block_size) -- -1 padding, or an index the CPU-only checks would have
// refused -- is skipped.
//
// paged_attention: one generic launch over work items (tile, KV-head chunk, key split) that serves
// prefill and decode alike, and, when the key range is split, a second launch that combines.
//  * A tile is up to `tokens_per_tile` consecutive query tokens of ONE sequence times up to
//    `heads_per_tile` query heads of ONE KV head's group, at most kMaxRows (query, head) rows and
//    kMaxQElems row elements, so K/V rows staged in shared memory serve every row. Prefill tiles
//    hold several tokens; a decode sequence (q_len 1) gets a one-token tile.
//  * Tile slots come straight from query_start_loc, with no host read and no scan: sequence b owns
//    the slots [o(b), o(b) + ceil(q_len_b / tokens_per_tile)) with o(b) = start_b / tokens_per_tile
//    + b, which never overlap for non-decreasing starts, so floor(T / tokens_per_tile) + B slots
//    cover every tile. A block finds its sequence by binary search over o(b); the gap slots exit.
//  * Keys are walked in tiles of `key_tile` (sized from head_dim to fill the shared memory): the
//    tile's K/V rows are converted to float in shared memory through the block table, every (row,
//    key) score is a dot product over `lanes` threads (a shuffle reduction), one warp per row folds
//    the tile into the row's online softmax (running max, sum, rescale), and each thread rescales
//    and accumulates its own (row, d) elements of the output in registers.
//  * Flash-decoding split: a tile's key range [k_lo, k_hi) is cut into splits = min(max_splits,
//    ceil(keys / 512)) equal chunks (short contexts: one split). max_splits is chosen on the host
//    so that the launch has about kBlocksPerSm blocks per SM (decode of few sequences splits; a
//    large batch or prefill does not). With one split a block normalises and writes `out`
//    directly; otherwise each split writes (max, sum, unnormalised acc[D]) per row to a float32
//    workspace and the combine kernel merges the splits by log-sum-exp, adding the sink term
//    exp(sink - max) to the denominator once, and writes `out`.
//  Semantics (as the CPU): query j of a sequence with q_len new tokens sits at position
//  seq_len - q_len + j and sees keys in [max(0, pos - window + 1), pos] (window 0: [0, pos]); q is
//  multiplied by `scale` before the dot; an empty row (or a row whose only mass is the sink)
//  outputs zeros; softmax and accumulation are float32, the output is rounded to the element type.
//  Guards (the CPU-only index checks are skipped for GPU tensors): query_start_loc entries are
//  clamped to [0, T] and q_len to [0, T - start], so a row written is always a row of `out`; keys
//  at positions >= max_blocks * block_size (seq_len beyond the table) and keys whose block id is
//  outside [0, num_blocks) are masked (never read); a negative seq_len leaves every key masked.
//  A tile's keys start at its first row's window, so the -1 entries a sliding KV-cache group
//  leaves before the window of a sequence's first new query are never reached (and would be
//  masked if they were).
#include <algorithm>
#include <cmath>

#include "gpu.h"
#include "kernels.h"

namespace gnomon::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxRows = 64;                               // (query, head) rows per tile
constexpr int kMaxQElems = 4096;                           // rows * head_dim per tile
constexpr int kAccPerThread = kMaxQElems / kThreads;       // output elements a thread owns
constexpr int kMaxKeyTile = 64;                            // keys staged per step
constexpr int kMaxDotLanes = 16;                           // threads sharing one dot product
constexpr int64_t kSplitKeys = 512;                        // keys per flash-decoding split
constexpr int kMaxSplits = 128;
constexpr int kBlocksPerSm = 4;                            // split until about this many blocks
constexpr int64_t kDynamicSmemBytes = 45 * 1024;           // + ~2.5 KiB static: under 48 KiB
static_assert(kMaxQElems % kThreads == 0, "whole accumulator slots per thread");
static_assert(kThreads % kWarpSize == 0, "whole warps per block");
static_assert(kWarpSize % kMaxDotLanes == 0, "dot-product lane groups stay inside a warp");

constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

template <typename T>
struct AttentionParams {
  const T* query;
  int64_t query_token_stride;  // elements from one token's query heads to the next's
  T* out;
  const T* key_cache;
  const T* value_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  const float* sinks;  // nullptr: none
  float* partials;     // split workspace; nullptr when max_splits == 1
  int64_t num_tokens, num_cache_blocks, capacity, window;
  int num_seqs, num_heads, num_kv_heads, group, head_dim, block_size, max_blocks;
  int heads_per_tile, head_chunks, tokens_per_tile, rows_per_tile, key_tile, max_splits;
  float scale;
};

// One tile: tokens [token0, token0 + count) of sequence b (token0 at key position pos0) with query
// heads [head0, head0 + heads) of one KV head; its keys [key_begin, key_end) split in `splits`
// chunks of `chunk` keys.
struct Tile {
  int64_t token0, pos0, key_begin, key_end, chunk;
  int b, count, head0, heads, splits;
};

template <typename T>
__device__ __forceinline__ int64_t clamped_start(const AttentionParams<T>& p, int b) {
  return imin(imax(p.query_start_loc[b], 0), p.num_tokens);
}

template <typename T>
__device__ __forceinline__ int64_t slot_offset(const AttentionParams<T>& p, int b) {
  return clamped_start(p, b) / p.tokens_per_tile + b;
}

// The tile of slot `slot`, KV-head chunk `y`; false for a gap slot (or a sequence with no tokens).
template <typename T>
__device__ bool resolve_tile(const AttentionParams<T>& p, int64_t slot, int y, Tile& tile) {
  int lo = 0, hi = p.num_seqs;  // the last b with slot_offset(b) <= slot
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (slot_offset(p, mid) <= slot) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int b = lo;
  const int64_t offset = slot_offset(p, b);
  if (offset > slot) return false;
  const int64_t start = clamped_start(p, b);
  const int64_t end = imin(imax(p.query_start_loc[b + 1], start), p.num_tokens);
  const int64_t q_len = end - start;
  const int64_t first = (slot - offset) * p.tokens_per_tile;
  if (first >= q_len) return false;

  tile.b = b;
  tile.count = static_cast<int>(imin(p.tokens_per_tile, q_len - first));
  tile.token0 = start + first;
  tile.pos0 = static_cast<int64_t>(p.seq_lens[b]) - q_len + first;
  const int kv_head = y / p.head_chunks, chunk_index = y % p.head_chunks;
  tile.head0 = kv_head * p.group + chunk_index * p.heads_per_tile;
  tile.heads = min(p.heads_per_tile, p.group - chunk_index * p.heads_per_tile);

  // The union of the rows' key ranges: the first row's window start to the last row's position.
  tile.key_begin = p.window > 0 ? imax(0, tile.pos0 - p.window + 1) : 0;
  tile.key_end = imax(tile.key_begin, imin(tile.pos0 + tile.count, p.capacity));
  const int64_t keys = tile.key_end - tile.key_begin;
  const int64_t wanted = (keys + kSplitKeys - 1) / kSplitKeys;
  tile.splits = static_cast<int>(imax(1, imin(p.max_splits, wanted)));
  tile.chunk = (keys + tile.splits - 1) / tile.splits;
  return true;
}

// Float offset of row r of split s of the item (slot, y) in the workspace: max, sum, acc[D].
template <typename T>
__device__ __forceinline__ int64_t partial_row(const AttentionParams<T>& p, int64_t slot, int y,
                                               int s, int r) {
  const int64_t item = slot * gridDim.y + y;
  return ((item * p.max_splits + s) * p.rows_per_tile + r) * (p.head_dim + 2);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(AttentionParams<T> p) {
  extern __shared__ float smem[];
  __shared__ float row_max[kMaxRows], row_sum[kMaxRows], row_scale[kMaxRows], row_inv[kMaxRows];
  __shared__ int64_t row_lo[kMaxRows], row_hi[kMaxRows];
  __shared__ int64_t key_row[kMaxKeyTile];  // cache row of each staged key; -1: masked

  const int64_t slot = blockIdx.x;
  const int y = blockIdx.y, split = blockIdx.z;
  Tile tile;
  if (!resolve_tile(p, slot, y, tile) || split >= tile.splits) return;  // uniform per block

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int D = p.head_dim, KT = p.key_tile;
  const int rows = tile.count * tile.heads;
  float* q_s = smem;                        // [rows_per_tile][D], scaled queries
  float* k_s = q_s + p.rows_per_tile * D;   // [KT][D + 1] (padded: conflict-free dot reads)
  float* v_s = k_s + KT * (D + 1);          // [KT][D]
  float* s_s = v_s + KT * D;                // [rows_per_tile][KT] scores, then weights

  const int64_t key_begin = tile.key_begin + static_cast<int64_t>(split) * tile.chunk;
  const int64_t key_end = imin(tile.key_end, key_begin + tile.chunk);

  // Row r is query token r / heads, head r % heads of the tile.
  for (int e = tid; e < rows * D; e += kThreads) {
    const int r = e / D, d = e - r * D;
    const int64_t token = tile.token0 + r / tile.heads;
    const int head = tile.head0 + r % tile.heads;
    q_s[e] = to_float(p.query[token * p.query_token_stride + head * D + d]) * p.scale;
  }
  if (tid < rows) {
    const int64_t pos = tile.pos0 + tid / tile.heads;
    row_lo[tid] = p.window > 0 ? imax(0, pos - p.window + 1) : 0;
    row_hi[tid] = imin(pos + 1, p.capacity);
    row_max[tid] = kNegInf;
    row_sum[tid] = 0.f;
  }

  float acc[kAccPerThread];
  int acc_row[kAccPerThread], acc_d[kAccPerThread];
#pragma unroll
  for (int i = 0; i < kAccPerThread; ++i) {
    const int e = tid + i * kThreads;
    acc[i] = 0.f;
    acc_row[i] = e < rows * D ? e / D : -1;
    acc_d[i] = e < rows * D ? e - acc_row[i] * D : 0;
  }

  // Threads per dot product: as many as keep the block busy, a power of two within a warp.
  int lanes = 1;
  while (lanes * 2 <= kMaxDotLanes && rows * KT * lanes * 2 <= kThreads) lanes *= 2;
  const int pairs = rows * KT;
  const int rounds = (pairs * lanes + kThreads - 1) / kThreads;  // uniform: shuffles stay legal

  const int32_t* table = p.block_tables + static_cast<int64_t>(tile.b) * p.max_blocks;
  const int64_t cache_row_elems = static_cast<int64_t>(p.num_kv_heads) * D;
  const int64_t head_offset = static_cast<int64_t>(tile.head0 / p.group) * D;
  __syncthreads();

  for (int64_t kb = key_begin; kb < key_end; kb += KT) {
    const int n = static_cast<int>(imin(KT, key_end - kb));
    __syncthreads();  // the previous step is done with key_row, k_s, v_s, s_s
    if (tid < KT) {
      int64_t row = -1;
      if (tid < n) {  // kb + tid < capacity, so the table index is inside the row
        const int64_t pos = kb + tid;
        const int64_t block = table[pos / p.block_size];
        if (block >= 0 && block < p.num_cache_blocks) {
          row = block * p.block_size + pos % p.block_size;
        }
      }
      key_row[tid] = row;
    }
    __syncthreads();
    for (int e = tid; e < KT * D; e += kThreads) {
      const int j = e / D, d = e - j * D;
      const int64_t row = key_row[j];
      float kf = 0.f, vf = 0.f;
      if (row >= 0) {
        const int64_t index = row * cache_row_elems + head_offset + d;
        kf = to_float(p.key_cache[index]);
        vf = to_float(p.value_cache[index]);
      }
      k_s[j * (D + 1) + d] = kf;
      v_s[j * D + d] = vf;
    }
    __syncthreads();

    // Scores: pair (r, j), keys fastest; `lanes` consecutive threads split the dot over d.
    for (int round = 0; round < rounds; ++round) {
      const int w = tid + round * kThreads;
      const int pair = w / lanes, part = w - pair * lanes;
      const int r = pair / KT, j = pair - r * KT;
      float dot = 0.f;
      if (pair < pairs) {
        const float* qr = q_s + r * D;
        const float* kr = k_s + j * (D + 1);
        for (int d = part; d < D; d += lanes) dot = fmaf(qr[d], kr[d], dot);
      }
      for (int offset = lanes / 2; offset > 0; offset /= 2) dot += shfl_xor(dot, offset);
      if (pair < pairs && part == 0) {
        const int64_t pos = kb + j;
        const bool live = key_row[j] >= 0 && pos >= row_lo[r] && pos < row_hi[r];
        s_s[r * KT + j] = live ? dot : kNegInf;
      }
    }
    __syncthreads();

    // Online softmax, one warp per row: weights replace the scores, the row's state is updated.
    for (int r = warp; r < rows; r += kWarps) {
      float* s = s_s + r * KT;
      float tile_max = kNegInf;
      for (int j = lane; j < KT; j += kWarpSize) tile_max = fmaxf(tile_max, s[j]);
      tile_max = warp_max(tile_max);
      const float old_max = row_max[r];
      const float new_max = fmaxf(old_max, tile_max);
      float sum = 0.f;
      for (int j = lane; j < KT; j += kWarpSize) {
        const float weight = new_max == kNegInf ? 0.f : expf(s[j] - new_max);
        s[j] = weight;
        sum += weight;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float rescale = new_max == kNegInf ? 1.f : expf(old_max - new_max);
        row_scale[r] = rescale;
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = new_max;
      }
    }
    __syncthreads();

    // Each thread's (row, d) elements: rescale, then add the weighted value rows. Masked keys
    // (weight 0) are skipped, as the CPU never reads them.
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i) {
      const int r = acc_row[i];
      if (r < 0) continue;
      const float* s = s_s + r * KT;
      const float* v = v_s + acc_d[i];
      float a = acc[i] * row_scale[r];
      for (int j = 0; j < n; ++j) {
        const float weight = s[j];
        if (weight != 0.f) a = fmaf(weight, v[j * D], a);
      }
      acc[i] = a;
    }
  }
  __syncthreads();

  if (tile.splits > 1) {
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i) {
      const int r = acc_row[i];
      if (r < 0) continue;
      float* row = p.partials + partial_row(p, slot, y, split, r);
      if (acc_d[i] == 0) {
        row[0] = row_max[r];
        row[1] = row_sum[r];
      }
      row[2 + acc_d[i]] = acc[i];
    }
    return;
  }

  // One split: normalise (the sink joins the denominator) and store.
  if (tid < rows) {
    const float m = row_max[tid];
    float max_all = m, sink = kNegInf;
    if (p.sinks != nullptr) {
      sink = p.sinks[tile.head0 + tid % tile.heads];
      max_all = fmaxf(m, sink);
    }
    float inv = 0.f;
    if (max_all != kNegInf) {
      const float self = m == kNegInf ? 0.f : expf(m - max_all);
      const float total = row_sum[tid] * self + (sink == kNegInf ? 0.f : expf(sink - max_all));
      inv = total > 0.f ? self / total : 0.f;
    }
    row_inv[tid] = inv;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kAccPerThread; ++i) {
    const int r = acc_row[i];
    if (r < 0) continue;
    const int64_t token = tile.token0 + r / tile.heads;
    const int head = tile.head0 + r % tile.heads;
    p.out[(token * p.num_heads + head) * D + acc_d[i]] = from_float<T>(acc[i] * row_inv[r]);
  }
}

// Merges the splits of one item (slot, y) by log-sum-exp, adds the sink once, writes `out`.
template <typename T>
__global__ void __launch_bounds__(kThreads) combine_splits_kernel(AttentionParams<T> p) {
  const int64_t slot = blockIdx.x;
  const int y = blockIdx.y;
  Tile tile;
  if (!resolve_tile(p, slot, y, tile) || tile.splits <= 1) return;  // written by the first pass
  const int D = p.head_dim, rows = tile.count * tile.heads;
  const int64_t stride = static_cast<int64_t>(p.rows_per_tile) * (D + 2);  // between splits
  for (int e = threadIdx.x; e < rows * D; e += kThreads) {
    const int r = e / D, d = e - r * D;
    const int head = tile.head0 + r % tile.heads;
    const float* first = p.partials + partial_row(p, slot, y, 0, r);
    float max_all = kNegInf;
    for (int s = 0; s < tile.splits; ++s) max_all = fmaxf(max_all, first[s * stride]);
    const float sink = p.sinks != nullptr ? p.sinks[head] : kNegInf;
    max_all = fmaxf(max_all, sink);
    float value = 0.f;
    if (max_all != kNegInf) {
      float total = sink == kNegInf ? 0.f : expf(sink - max_all), sum = 0.f;
      for (int s = 0; s < tile.splits; ++s) {
        const float* part = first + s * stride;
        if (part[0] == kNegInf) continue;  // an empty or fully masked split
        const float weight = expf(part[0] - max_all);
        total += part[1] * weight;
        sum += part[2 + d] * weight;
      }
      value = total > 0.f ? sum / total : 0.f;
    }
    const int64_t token = tile.token0 + r / tile.heads;
    p.out[(token * p.num_heads + head) * D + d] = from_float<T>(value);
  }
}

template <typename T>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         T* __restrict__ key_cache, T* __restrict__ value_cache,
                                         const int64_t* __restrict__ slot_mapping,
                                         int64_t row_elems, int64_t key_stride,
                                         int64_t value_stride, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;  // -1 padding, or an index out of the cache
  const T* k = key + t * key_stride;  // tokens lie their row strides apart (TensorView::row_stride)
  const T* v = value + t * value_stride;
  T* kc = key_cache + slot * row_elems;
  T* vc = value_cache + slot * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    kc[i] = k[i];
    vc[i] = v[i];
  }
}

int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  thread_local int counts[kMaxDevices] = {};
  int device = 0;
  check(hipGetDevice(&device), "paged_attention: hipGetDevice");
  if (device < 0 || device >= kMaxDevices) return 1;
  if (counts[device] == 0) {
    int count = 0;
    check(hipDeviceGetAttribute(&count, hipDeviceAttributeMultiprocessorCount, device),
          "paged_attention: multiprocessor count");
    counts[device] = std::max(count, 1);
  }
  return counts[device];
}

}  // namespace

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping) {
  const int64_t tokens = key.size(0), row_elems = key.size(1) * key.size(2);
  if (tokens == 0 || row_elems == 0) return;
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  constexpr int kCopyThreads = 256;
  dispatch_floating(key.dtype, [&](auto tag) {
    using T = decltype(tag);
    reshape_and_cache_kernel<T><<<static_cast<unsigned>(tokens), kCopyThreads, 0,
                                  stream_of(key.stream)>>>(
        data<T>(key), data<T>(value), data<T>(key_cache), data<T>(value_cache),
        data<int64_t>(slot_mapping), row_elems, key.row_stride(), value.row_stride(), num_slots);
  });
  check_launch("reshape_and_cache");
}

void paged_attention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_tables,
                     const TensorView& seq_lens, const TensorView& query_start_loc, double scale,
                     int64_t sliding_window, const TensorView* sinks) {
  if (out.numel() == 0) return;  // no query tokens (or no heads)
  const int64_t num_tokens = query.size(0), num_heads = query.size(1), head_dim = query.size(2);
  const int64_t num_kv_heads = key_cache.size(2), block_size = key_cache.size(1);
  const int64_t batch = block_tables.size(0), max_blocks = block_tables.size(1);
  if (batch == 0) return;  // no sequence owns a token (the CPU checks would refuse T > 0)
  const int64_t group = num_heads / num_kv_heads;

  // Tile shape: a KV head's group of query heads (chunked when it exceeds the row budget), times
  // as many tokens as the budget leaves.
  const int64_t max_rows = std::min<int64_t>(kMaxRows, kMaxQElems / head_dim);
  const int64_t heads_per_tile = std::min(group, max_rows);
  const int64_t head_chunks = ceil_div(group, heads_per_tile);
  const int64_t tokens_per_tile = std::max<int64_t>(1, max_rows / heads_per_tile);
  const int64_t rows_per_tile = tokens_per_tile * heads_per_tile;
  const int64_t smem_floats = kDynamicSmemBytes / static_cast<int64_t>(sizeof(float));
  const int64_t key_tile = std::clamp<int64_t>(
      (smem_floats - rows_per_tile * head_dim) / (2 * head_dim + 1 + rows_per_tile), 1,
      kMaxKeyTile);
  const int64_t smem_bytes =
      (rows_per_tile * head_dim + key_tile * (2 * head_dim + 1) + rows_per_tile * key_tile) *
      static_cast<int64_t>(sizeof(float));

  const int64_t slots = num_tokens / tokens_per_tile + batch;
  const int64_t grid_y = num_kv_heads * head_chunks;
  if (slots > 0x7fffffff || grid_y > 65535) {
    raise<ValueError>("paged_attention: ", num_tokens, " tokens of ", num_heads,
                      " heads exceed the GPU grid");
  }

  // Split the key range only when the launch alone would leave SMs idle.
  const int64_t capacity = max_blocks * block_size;
  const int64_t useful_splits =
      std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, ceil_div(capacity, kSplitKeys)));
  const int64_t target_blocks = static_cast<int64_t>(kBlocksPerSm) * multiprocessor_count();
  const int64_t max_splits =
      std::clamp<int64_t>(target_blocks / (slots * grid_y), 1, useful_splits);
  float* partials = nullptr;
  if (max_splits > 1) {
    const int64_t floats = slots * grid_y * max_splits * rows_per_tile * (head_dim + 2);
    partials = static_cast<float*>(workspace(static_cast<size_t>(floats) * sizeof(float)));
  }

  const hipStream_t stream = stream_of(query.stream);
  dispatch_floating(query.dtype, [&](auto tag) {
    using T = decltype(tag);
    AttentionParams<T> p;
    p.query = data<T>(query);
    p.query_token_stride = query.row_stride();
    p.out = data<T>(out);
    p.key_cache = data<T>(key_cache);
    p.value_cache = data<T>(value_cache);
    p.block_tables = data<int32_t>(block_tables);
    p.seq_lens = data<int32_t>(seq_lens);
    p.query_start_loc = data<int32_t>(query_start_loc);
    p.sinks = sinks != nullptr ? data<float>(*sinks) : nullptr;
    p.partials = partials;
    p.num_tokens = num_tokens;
    p.num_cache_blocks = key_cache.size(0);
    p.capacity = capacity;
    p.window = sliding_window;
    p.num_seqs = static_cast<int>(batch);
    p.num_heads = static_cast<int>(num_heads);
    p.num_kv_heads = static_cast<int>(num_kv_heads);
    p.group = static_cast<int>(group);
    p.head_dim = static_cast<int>(head_dim);
    p.block_size = static_cast<int>(block_size);
    p.max_blocks = static_cast<int>(max_blocks);
    p.heads_per_tile = static_cast<int>(heads_per_tile);
    p.head_chunks = static_cast<int>(head_chunks);
    p.tokens_per_tile = static_cast<int>(tokens_per_tile);
    p.rows_per_tile = static_cast<int>(rows_per_tile);
    p.key_tile = static_cast<int>(key_tile);
    p.max_splits = static_cast<int>(max_splits);
    p.scale = static_cast<float>(scale);

    const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(grid_y),
                    static_cast<unsigned>(max_splits));
    paged_attention_kernel<T><<<grid, kThreads, static_cast<size_t>(smem_bytes), stream>>>(p);
    check_launch("paged_attention");
    if (max_splits > 1) {
      const dim3 combine_grid(static_cast<unsigned>(slots), static_cast<unsigned>(grid_y));
      combine_splits_kernel<T><<<combine_grid, kThreads, 0, stream>>>(p);
      check_launch("paged_attention");
    }
  });
}

}  // namespace gnomon::gpu
