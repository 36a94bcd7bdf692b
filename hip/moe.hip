// topk_routing and fused_moe (csrc/cpu/moe.cpp is the reference; this file matches its semantics).
//
// topk_routing: one warp per token. SoftmaxTopk takes the max with the CPU's comparison, sums the
// exps in expert order (lanes compute them, every lane adds them up in order through shuffles, so
// the denominator is the CPU's sequential sum), then selects the top k in k rounds of a warp
// argmax over math::topk_before with the lower id winning ties. Round j picks the best element
// ranked strictly after round j-1's pick, which is the CPU's topk_insert result (a stable
// descending sort's first k), NaN handling included. Renormalising and the TopkSoftmax softmax
// over the k sum in slot order, as the CPU does.
//
// fused_moe: tokens go through in chunks that bound the float32 buffers (kChunkBytes); per chunk
// of n tokens with P = n * k (token, slot) pairs, p = t * k + j:
//   1. moe_count:  counts[e] = pairs routed to expert e (integer atomics; ids outside [0, E) are
//                  skipped, so they contribute nothing and are never read through).
//   2. moe_scan:   one block: offsets[e] (exclusive prefix sum of counts, offsets[E] = valid
//                  pairs) and tile_offsets[e] (prefix sum of ceil(counts[e] / kBM)).
//   3. moe_place:  one block per expert compacts its pairs in pair order (stable, so expert e's
//                  positions [offsets[e], offsets[e+1]) hold its pairs by token, then slot, as
//                  the CPU's slots): sorted_pair[s] = p, pair_pos[p] = s (-1: skipped pair).
//   4. moe_gemm<gate/up>: grouped GEMM; block (tile, column block) maps its tile index to
//                  (expert, kBM positions) by a binary search of tile_offsets, streams kBN/2 gate
//                  and kBN/2 up rows of w13[e] (MXFP4 decoded in registers into the shared tile;
//                  no full-precision weights in global memory) against the gathered hidden rows,
//                  adds the bias and writes the activation to A[s, I] in float32 (the CPU keeps
//                  it in float32 too: no rounding before the down projection).
//   5. moe_gemm<down>: the same over w2[e] with A as the activations: Y[s, H] = w2 @ a + b2 in
//                  float32.
//   4'/5'. decode path (MXFP4 weights, n <= kGemvMaxTokens = 64 tokens in the chunk, 16-byte
//                  aligned w13/w2; dense weights always take the grouped GEMM): moe_gemv<gate/up>
//                  and moe_gemv<down> replace the two grouped GEMMs, whose 32-position tiles are
//                  mostly empty at decode. Grid (column block, expert); blocks of experts without
//                  pairs leave at once. 256 threads = 16 groups of 16 lanes (any warp width); each
//                  group owns two weight rows of its expert: gate/up, column j's gate row and up
//                  row (per the layout); down, rows h and h + 16 of a 32-row block. The block goes
//                  over its expert's positions in chunks of up to MT pairs (MT = 1, 4 or 16, from
//                  n on the host; any count is correct, more pairs just mean more chunks, each
//                  re-reading the rows), and per K chunk of 512 elements each lane does one 16-byte
//                  load of one MX block's codes (plus its scale byte) per row, issued a chunk ahead,
//                  decodes the nibbles in registers (element 2i is byte i's low nibble) and
//                  multiplies code * scale with the chunk's activations of the MT pairs (hidden rows
//                  or A rows as float32, staged in shared memory). So each weight byte is read once
//                  per pair chunk. The 16 lanes' sums are reduced with xor shuffles; the bias,
//                  activation and A / Y writes are those of moe_gemm (same float32 epilogue).
//   6. moe_combine: out[t] = sum over the token's valid pairs, in position order (expert
//                  ascending, then slot: the CPU's accumulation order), of weight * Y[s], in
//                  float32 and without atomics, rounded to the element type once.
// Workspace (gpu::workspace, each region 256-byte aligned), with P the pairs of the largest chunk:
//   int32 counts[E] | offsets[E+1] | tile_offsets[E+1] | sorted_pair[P] | pair_pos[P]
//   float A[P, I] | float Y[P, H]
#include <algorithm>

#include "gpu.h"
#include "kernels.h"

namespace gnomon::gpu {
namespace {

// ---- routing -------------------------------------------------------------------------------------

constexpr int kRoutingThreads = 256;

// The selection order: topk_before, then the lower id first (ids are distinct).
__device__ __forceinline__ bool ranks_before(float a, int a_id, float b, int b_id) {
  return math::topk_before(a, b) || (!math::topk_before(b, a) && a_id < b_id);
}

template <typename T>
__global__ void topk_routing_kernel(float* __restrict__ weights, int32_t* __restrict__ ids,
                                    const T* __restrict__ logits, int64_t tokens, int64_t experts,
                                    int k, bool softmax_first, bool renormalize) {
  constexpr int kSlots = static_cast<int>((kMaxTopK + kWarpSize - 1) / kWarpSize);
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / kWarpSize; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * warps) {
    const T* row = logits + t * experts;
    float mx = -INFINITY, inv = 1.0f;
    if (softmax_first) {
      for (int64_t i = lane; i < experts; i += kWarpSize) {
        const float v = to_float(row[i]);
        mx = v > mx ? v : mx;  // the CPU's comparison: NaN never becomes the max
      }
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const float other = shfl_xor(mx, offset);
        mx = other > mx ? other : mx;
      }
      // The denominator in expert order, as the CPU sums it; every lane ends with the same sum.
      float sum = 0.0f;
      for (int64_t base = 0; base < experts; base += kWarpSize) {
        const int64_t i = base + lane;
        const float p = i < experts ? expf(to_float(row[i]) - mx) : 0.0f;
        const int n = static_cast<int>(experts - base < kWarpSize ? experts - base : kWarpSize);
        for (int src = 0; src < n; ++src) sum += shfl(p, src);
      }
      inv = 1.0f / sum;
    }

    float kept[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) kept[s] = 0.0f;
    float prev = 0.0f, first = 0.0f, total = 0.0f;
    int prev_id = -1;
    for (int j = 0; j < k; ++j) {
      float best = 0.0f;
      int best_id = -1;
      for (int64_t i = lane; i < experts; i += kWarpSize) {
        const float l = to_float(row[i]);
        const float v = softmax_first ? expf(l - mx) * inv : l;
        const int id = static_cast<int>(i);
        if (prev_id >= 0 && !ranks_before(prev, prev_id, v, id)) continue;  // taken or better
        if (best_id < 0 || ranks_before(v, id, best, best_id)) {
          best = v;
          best_id = id;
        }
      }
#pragma unroll
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const float other = shfl_xor(best, offset);
        const int other_id = shfl_xor(best_id, offset);
        if (other_id >= 0 && (best_id < 0 || ranks_before(other, other_id, best, best_id))) {
          best = other;
          best_id = other_id;
        }
      }
      prev = best;
      prev_id = best_id;
      float w = best;
      if (!softmax_first) {
        if (j == 0) first = best;  // the list is descending: the first pick is the max
        w = expf(best - first);
      }
      total += w;  // slot order, as the CPU sums
      if (lane == j % kWarpSize) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          if (s == j / kWarpSize) kept[s] = w;
        }
        ids[t * k + j] = best_id;
      }
      if (best_id < 0) break;  // fewer than k experts (the host check refuses this)
    }
    const bool divide = !softmax_first || renormalize;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int j = s * kWarpSize + lane;
      if (j < k) weights[t * k + j] = divide ? kept[s] / total : kept[s];
    }
  }
}

// ---- fused MoE: sorting the pairs by expert -------------------------------------------------------

constexpr int kSortThreads = 256;

__global__ void moe_count_kernel(int32_t* __restrict__ counts, const int32_t* __restrict__ ids,
                                 int64_t pairs, int64_t experts) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
}

// Exclusive block scan of one int per thread (blockDim.x == kSortThreads); returns the prefix
// and writes the block total to `total`.
__device__ __forceinline__ int block_exclusive_scan(int v, int* scratch, int& total) {
  const int tid = threadIdx.x;
  scratch[tid] = v;
  __syncthreads();
  for (int offset = 1; offset < kSortThreads; offset *= 2) {
    const int add = tid >= offset ? scratch[tid - offset] : 0;
    __syncthreads();
    scratch[tid] += add;
    __syncthreads();
  }
  const int inclusive = scratch[tid];
  total = scratch[kSortThreads - 1];
  __syncthreads();
  return inclusive - v;
}

// One block: offsets[e] and tile_offsets[e] (tiles of `tile_rows` positions), e in [0, E].
__global__ void moe_scan_kernel(int32_t* __restrict__ offsets, int32_t* __restrict__ tile_offsets,
                                const int32_t* __restrict__ counts, int64_t experts,
                                int tile_rows) {
  __shared__ int scratch[kSortThreads];
  int base = 0, tile_base = 0;
  for (int64_t e0 = 0; e0 < experts; e0 += kSortThreads) {
    const int64_t e = e0 + threadIdx.x;
    const int c = e < experts ? counts[e] : 0;
    int sum = 0, tile_sum = 0;
    const int prefix = block_exclusive_scan(c, scratch, sum);
    const int tile_prefix = block_exclusive_scan((c + tile_rows - 1) / tile_rows, scratch, tile_sum);
    if (e < experts) {
      offsets[e] = base + prefix;
      tile_offsets[e] = tile_base + tile_prefix;
    }
    base += sum;
    tile_base += tile_sum;
  }
  if (threadIdx.x == 0) {
    offsets[experts] = base;
    tile_offsets[experts] = tile_base;
  }
}

// Block e: expert e's pairs in pair order, at positions offsets[e] onwards.
__global__ void moe_place_kernel(int32_t* __restrict__ sorted_pair, int32_t* __restrict__ pair_pos,
                                 const int32_t* __restrict__ ids, const int32_t* __restrict__ offsets,
                                 int64_t pairs) {
  __shared__ int warp_counts[kSortThreads / 32 + 1];
  const int e = blockIdx.x;
  int base = offsets[e];
  if (offsets[e + 1] == base) return;  // no pairs: the whole block leaves
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = kSortThreads / kWarpSize;
  const LaneMask below = (static_cast<LaneMask>(1) << lane) - 1;
  for (int64_t p0 = 0; p0 < pairs; p0 += kSortThreads) {
    const int64_t p = p0 + threadIdx.x;
    const bool mine = p < pairs && ids[p] == e;
    const LaneMask mask = ballot(mine);
    if (lane == 0) warp_counts[warp] = __popcll(mask);
    __syncthreads();
    int before = 0, tile_total = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      tile_total += warp_counts[w];
    }
    if (mine) {
      const int s = base + before + __popcll(mask & below);
      sorted_pair[s] = static_cast<int32_t>(p);
      pair_pos[p] = s;
    }
    base += tile_total;
    __syncthreads();
  }
}

// ---- fused MoE: the grouped GEMMs ------------------------------------------------------------------

constexpr int kBM = 32;    // positions (token rows) per tile
constexpr int kBN = 128;   // weight rows per tile (gate/up: kBN / 2 gate rows and as many up rows)
constexpr int kBK = 32;    // reduction depth per shared tile (one MXFP4 block)
constexpr int kGemmThreads = 256;  // 16 x 16: each thread 2 positions x 8 weight rows
constexpr int kTM = 2, kTN = 8, kTX = 16;
static_assert(kTX * kTX == kGemmThreads && kTM * kTX == kBM && kTN * kTX == kBN, "tile shape");

struct GemmArgs {
  const void* x;              // activations: hidden [n, K] (gate/up) or A [P, K] (down)
  const int32_t* sorted_pair; // gate/up: position -> pair (its token is pair / top_k)
  int64_t top_k;
  const void* w;              // [E, R, K] dense or [E, R, K/2] MXFP4
  const uint8_t* scales;      // MXFP4: [E, R, K/32]
  const void* bias;           // [E, R] or null
  int64_t rows;               // R: 2I (gate/up) or H (down)
  int64_t K;
  int64_t cols;               // output columns: I (gate/up) or H (down)
  const int32_t* offsets;     // [E + 1]
  const int32_t* tile_offsets;// [E + 1]
  int64_t experts;
  float* out;                 // [P, cols]
  bool interleaved;
  bool swiglu_oai;
};

// T: the element type (hidden, dense weights, biases); In: the activation rows' type.
template <typename T, typename In, bool kMxfp4, bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads) moe_gemm_kernel(GemmArgs args) {
  __shared__ float xs[kBK][kBM + 1];
  __shared__ float ws[kBK][kBN + 1];
  __shared__ int64_t x_row[kBM];  // activation row of each position, -1 past the expert's end
  __shared__ int64_t w_row[kBN];  // weight row within the expert, -1 past the output columns

  const int64_t tile = blockIdx.x;
  if (tile >= args.tile_offsets[args.experts]) return;
  // The expert: the last e with tile_offsets[e] <= tile (empty experts have no tiles).
  int64_t lo = 0, hi = args.experts - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (args.tile_offsets[mid] <= tile) lo = mid; else hi = mid - 1;
  }
  const int64_t e = lo;
  const int64_t s0 = args.offsets[e] + (tile - args.tile_offsets[e]) * kBM;
  const int64_t s_end = args.offsets[e + 1];
  const int64_t K = args.K;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * (kGateUp ? kBN / 2 : kBN);
  const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;

  for (int m = tid; m < kBM; m += kGemmThreads) {
    const int64_t s = s0 + m;
    if (s >= s_end) {
      x_row[m] = -1;
    } else if (kGateUp) {
      x_row[m] = args.sorted_pair[s] / args.top_k;
    } else {
      x_row[m] = s;
    }
  }
  for (int r = tid; r < kBN; r += kGemmThreads) {
    int64_t row = -1;
    if (kGateUp) {
      const int64_t j = c0 + (r % (kBN / 2));
      if (j < args.cols) {
        const bool up = r >= kBN / 2;
        row = args.interleaved ? 2 * j + (up ? 1 : 0) : (up ? args.cols + j : j);
      }
    } else {
      const int64_t h = c0 + r;
      if (h < args.cols) row = h;
    }
    w_row[r] = row;
  }
  __syncthreads();

  const In* x = static_cast<const In*>(args.x);
  float acc[kTM][kTN];
#pragma unroll
  for (int m = 0; m < kTM; ++m)
#pragma unroll
    for (int c = 0; c < kTN; ++c) acc[m][c] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int i = tid; i < kBM * kBK; i += kGemmThreads) {
      const int m = i / kBK, kk = i % kBK;
      const int64_t row = x_row[m], k = k0 + kk;
      xs[kk][m] = row >= 0 && k < K ? to_float(x[row * K + k]) : 0.0f;
    }
    if (kMxfp4) {
      // K % 32 == 0: the tile is one block of each row, kBK / 2 bytes and one E8M0 scale.
      const uint8_t* w = static_cast<const uint8_t*>(args.w);
      for (int i = tid; i < kBN * (kBK / 2); i += kGemmThreads) {
        const int r = i / (kBK / 2), q = i % (kBK / 2);
        const int64_t row = w_row[r];
        float lo_v = 0.0f, hi_v = 0.0f;
        if (row >= 0) {
          const int64_t wr = e * args.rows + row;
          const uint8_t byte = w[wr * (K / 2) + k0 / 2 + q];
          const float scale = math::e8m0_to_float(args.scales[wr * (K / 32) + k0 / 32]);
          lo_v = math::mxfp4_low(byte) * scale;
          hi_v = math::mxfp4_high(byte) * scale;
        }
        ws[2 * q][r] = lo_v;
        ws[2 * q + 1][r] = hi_v;
      }
    } else {
      const T* w = static_cast<const T*>(args.w);
      for (int i = tid; i < kBN * kBK; i += kGemmThreads) {
        const int r = i / kBK, kk = i % kBK;
        const int64_t row = w_row[r], k = k0 + kk;
        ws[kk][r] = row >= 0 && k < K ? to_float(w[(e * args.rows + row) * K + k]) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int m = 0; m < kTM; ++m) a[m] = xs[kk][ty + kTX * m];
#pragma unroll
      for (int c = 0; c < kTN; ++c) b[c] = ws[kk][tx + kTX * c];
#pragma unroll
      for (int m = 0; m < kTM; ++m)
#pragma unroll
        for (int c = 0; c < kTN; ++c) acc[m][c] = fmaf(a[m], b[c], acc[m][c]);
    }
    __syncthreads();
  }

  const T* bias = static_cast<const T*>(args.bias);
#pragma unroll
  for (int m = 0; m < kTM; ++m) {
    const int64_t s = s0 + ty + kTX * m;
    if (s >= s_end) continue;
    float* out = args.out + s * args.cols;
    if (kGateUp) {
#pragma unroll
      for (int c = 0; c < kTN / 2; ++c) {
        const int r = tx + kTX * c;  // gate row r, up row r + kBN / 2: the same column
        const int64_t j = c0 + r;
        if (j >= args.cols) continue;
        const int64_t gate_row = w_row[r], up_row = w_row[r + kBN / 2];
        const float gate_bias = bias ? to_float(bias[e * args.rows + gate_row]) : 0.0f;
        const float up_bias = bias ? to_float(bias[e * args.rows + up_row]) : 0.0f;
        const float g = acc[m][c] + gate_bias, u = acc[m][c + kTN / 2] + up_bias;
        out[j] = args.swiglu_oai ? math::swiglu_oai(g, u) : math::silu_and_mul(g, u);
      }
    } else {
#pragma unroll
      for (int c = 0; c < kTN; ++c) {
        const int64_t h = c0 + tx + kTX * c;
        if (h >= args.cols) continue;
        const float b = bias ? to_float(bias[e * args.rows + h]) : 0.0f;
        out[h] = acc[m][c] + b;
      }
    }
  }
}

// ---- fused MoE: the decode path (MXFP4 GEMV over each expert's pairs) -------------------------------

constexpr int kMxBlock = math::kMxfp4BlockSize;        // elements per MX block (32)
constexpr int kGemvThreads = 256;
constexpr int kGemvLanes = 16;                              // lanes per group (any warp width)
constexpr int kGemvGroups = kGemvThreads / kGemvLanes;      // groups per block, 2 rows each
constexpr int kGemvChunkBlocks = kGemvLanes;                // one MX block per lane per K chunk
constexpr int kGemvChunk = kGemvChunkBlocks * kMxBlock;     // K elements per chunk
// Shared slot of one MX block of one pair's activations: 32 floats and 4 of padding, so the
// float4 reads of the 16 lanes (on 16 different blocks) spread over the banks.
constexpr int kGemvSlot = kMxBlock + 4;
constexpr int kGemvRowFloats = kGemvChunkBlocks * kGemvSlot;
constexpr int64_t kGemvMaxTokens = 64;  // the host takes the decode path up to this many tokens

// acc[m] += sum_e (code_e * scale) * x[m][e] over the lane's MX block (element 2i is the low
// nibble of byte i, so element e sits at bit 4e of the 16 bytes) for the first m_rows pairs, one
// 32-bit word (8 elements) at a time to keep few decoded weights live. The weights are code *
// scale as in moe_gemm_kernel (exact barring float over/underflow).
template <int MT>
__device__ __forceinline__ void moe_gemv_block(const uint4& codes, uint8_t scale_byte,
                                               const float* x_slot, int m_rows, float (&acc)[MT]) {
  const float scale = math::e8m0_to_float(scale_byte);
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = decode_e2m1(words[q] >> (4 * i)) * scale;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < m_rows) {
        const float4 lo = *reinterpret_cast<const float4*>(x_slot + m * kGemvRowFloats + 8 * q);
        const float4 hi = *reinterpret_cast<const float4*>(x_slot + m * kGemvRowFloats + 8 * q + 4);
        float s0 = w[0] * lo.x, s1 = w[1] * lo.y;
        s0 = fmaf(w[2], lo.z, s0);
        s1 = fmaf(w[3], lo.w, s1);
        s0 = fmaf(w[4], hi.x, s0);
        s1 = fmaf(w[5], hi.y, s1);
        s0 = fmaf(w[6], hi.z, s0);
        s1 = fmaf(w[7], hi.w, s1);
        acc[m] += s0 + s1;
      }
    }
  }
}

// Block (column block, expert e): each 16-lane group owns two weight rows of expert e and
// streams them once per chunk of up to MT of e's pairs. Gate/up: group g owns column
// j = blockIdx.x * kGemvGroups + g (its gate row and its up row) and writes A[s, j] for e's
// positions s; down: rows h = blockIdx.x * 2 * kGemvGroups + g and h + kGemvGroups, writing
// Y[s, h]. Per K chunk of kGemvChunk elements each lane loads one MX block of each row (one
// 16-byte load of codes and the scale byte; the next chunk's loads are issued before this
// chunk's activations are staged), the chunk's activations of the MT pairs are staged in
// shared memory as float32, and the 16 lanes' sums are reduced with xor shuffles at the end.
// Needs K % 32 == 0 and 16-byte aligned weights (rows are K/2 bytes, a multiple of 16).
template <typename T, typename In, int MT, bool kGateUp>
__global__ void __launch_bounds__(kGemvThreads) moe_gemv_kernel(GemmArgs args) {
  __shared__ __align__(16) float xs[MT * kGemvRowFloats];
  __shared__ int64_t x_row[MT];
  const int64_t e = blockIdx.y;
  const int64_t s_begin = args.offsets[e], s_end = args.offsets[e + 1];
  if (s_begin == s_end) return;  // no pairs: the whole block leaves
  const int tid = threadIdx.x, sub = tid % kGemvLanes, group = tid / kGemvLanes;
  const int64_t K = args.K, row_blocks = K / kMxBlock;
  const int64_t chunks = (row_blocks + kGemvChunkBlocks - 1) / kGemvChunkBlocks;

  int64_t col0, col1, row0, row1;  // the group's output columns and weight rows
  if (kGateUp) {
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvGroups + group;
    col0 = col1 = j;
    row0 = args.interleaved ? 2 * j : j;                  // gate
    row1 = args.interleaved ? 2 * j + 1 : args.cols + j;  // up
  } else {
    col0 = row0 = static_cast<int64_t>(blockIdx.x) * (2 * kGemvGroups) + group;
    col1 = row1 = col0 + kGemvGroups;
  }
  const bool ok0 = col0 < args.cols, ok1 = col1 < args.cols;
  const int64_t wr0 = e * args.rows + (ok0 ? row0 : 0), wr1 = e * args.rows + (ok1 ? row1 : 0);
  const uint4* w0 = static_cast<const uint4*>(args.w) + wr0 * (K / 32);  // 16 bytes a block
  const uint4* w1 = static_cast<const uint4*>(args.w) + wr1 * (K / 32);
  const uint8_t* sc0 = args.scales + wr0 * row_blocks;
  const uint8_t* sc1 = args.scales + wr1 * row_blocks;
  const In* x = static_cast<const In*>(args.x);
  const T* bias = static_cast<const T*>(args.bias);

  for (int64_t p0 = s_begin; p0 < s_end; p0 += MT) {
    const int m_rows = static_cast<int>(s_end - p0 < MT ? s_end - p0 : MT);
    // x_row is last read before the previous pair chunk's final __syncthreads below.
    if (tid < MT) {
      const int64_t s = p0 + (tid < m_rows ? tid : 0);
      x_row[tid] = kGateUp ? args.sorted_pair[s] / args.top_k : s;
    }
    float acc0[MT], acc1[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc0[m] = acc1[m] = 0.0f;
    auto has = [&](int64_t c) { return c * kGemvChunkBlocks + sub < row_blocks; };
    uint4 c0 = make_uint4(0, 0, 0, 0), c1 = make_uint4(0, 0, 0, 0);
    uint8_t s0 = 0, s1 = 0;
    if (has(0)) {
      if (ok0) { c0 = w0[sub]; s0 = sc0[sub]; }
      if (ok1) { c1 = w1[sub]; s1 = sc1[sub]; }
    }
    for (int64_t c = 0; c < chunks; ++c) {
      // The next chunk's weights first, so they are in flight while the activations load.
      uint4 n0 = make_uint4(0, 0, 0, 0), n1 = make_uint4(0, 0, 0, 0);
      uint8_t t0 = 0, t1 = 0;
      if (has(c + 1)) {
        const int64_t b = (c + 1) * kGemvChunkBlocks + sub;
        if (ok0) { n0 = w0[b]; t0 = sc0[b]; }
        if (ok1) { n1 = w1[b]; t1 = sc1[b]; }
      }
      __syncthreads();  // x_row is written; the previous chunk's reads of xs are done
      const int64_t k0 = c * kGemvChunk;
      for (int i = tid; i < m_rows * kGemvChunk; i += kGemvThreads) {
        const int m = i / kGemvChunk, jj = i % kGemvChunk;
        const float v = k0 + jj < K ? to_float(x[x_row[m] * K + k0 + jj]) : 0.0f;
        xs[m * kGemvRowFloats + (jj / kMxBlock) * kGemvSlot + jj % kMxBlock] = v;
      }
      __syncthreads();
      if (has(c)) {
        if (ok0) moe_gemv_block<MT>(c0, s0, xs + sub * kGemvSlot, m_rows, acc0);
        if (ok1) moe_gemv_block<MT>(c1, s1, xs + sub * kGemvSlot, m_rows, acc1);
      }
      c0 = n0; c1 = n1; s0 = t0; s1 = t1;
    }
    // Sum over the group's 16 lanes (xor offsets below 16 stay inside the group and the warp).
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int offset = kGemvLanes / 2; offset > 0; offset /= 2) {
        acc0[m] += shfl_xor(acc0[m], offset);
        acc1[m] += shfl_xor(acc1[m], offset);
      }
    }
    // Lane m of the group writes pair p0 + m (every lane holds the sums).
    if (kGateUp) {
      if (ok0) {
        const float gate_bias = bias ? to_float(bias[e * args.rows + row0]) : 0.0f;
        const float up_bias = bias ? to_float(bias[e * args.rows + row1]) : 0.0f;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m != sub || m >= m_rows) continue;
          const float g = acc0[m] + gate_bias, u = acc1[m] + up_bias;
          args.out[(p0 + m) * args.cols + col0] =
              args.swiglu_oai ? math::swiglu_oai(g, u) : math::silu_and_mul(g, u);
        }
      }
    } else {
      const float b0 = bias && ok0 ? to_float(bias[e * args.rows + row0]) : 0.0f;
      const float b1 = bias && ok1 ? to_float(bias[e * args.rows + row1]) : 0.0f;
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m != sub || m >= m_rows) continue;
        if (ok0) args.out[(p0 + m) * args.cols + col0] = acc0[m] + b0;
        if (ok1) args.out[(p0 + m) * args.cols + col1] = acc1[m] + b1;
      }
    }
  }
}

// ---- fused MoE: combining the pairs ------------------------------------------------------------------

constexpr int kCombineThreads = 256;

// Block (token t, column block): out[t, h] = sum of weight * Y[s, h] over t's valid pairs in
// position order, rounded to T once.
template <typename T>
__global__ void moe_combine_kernel(T* __restrict__ out, const float* __restrict__ y,
                                   const int32_t* __restrict__ pair_pos,
                                   const float* __restrict__ routing, int64_t top_k, int64_t H) {
  __shared__ int32_t pos[kMaxTopK];
  __shared__ int32_t order_pos[kMaxTopK];
  __shared__ float order_w[kMaxTopK];
  const int64_t t = blockIdx.x;
  const int k = static_cast<int>(top_k);
  for (int j = threadIdx.x; j < k; j += blockDim.x) pos[j] = pair_pos[t * top_k + j];
  __syncthreads();
  int valid = 0;
  for (int j = 0; j < k; ++j) valid += pos[j] >= 0 ? 1 : 0;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const int32_t s = pos[j];
    if (s < 0) continue;
    int rank = 0;  // positions of valid pairs are distinct
    for (int i = 0; i < k; ++i) rank += pos[i] >= 0 && pos[i] < s ? 1 : 0;
    order_pos[rank] = s;
    order_w[rank] = routing[t * top_k + j];
  }
  __syncthreads();
  const int64_t h = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (h >= H) return;
  float acc = 0.0f;
  for (int r = 0; r < valid; ++r) acc = fmaf(order_w[r], y[order_pos[r] * H + h], acc);
  out[t * H + h] = from_float<T>(acc);
}

// The decode path's two launches: grid (column blocks, experts); experts without pairs leave.
template <typename T, int MT>
void launch_moe_gemv(const GemmArgs& up, const GemmArgs& down, hipStream_t stream) {
  const dim3 up_grid(static_cast<unsigned>(std::max<int64_t>(1, ceil_div(up.cols, kGemvGroups))),
                     static_cast<unsigned>(up.experts));
  moe_gemv_kernel<T, T, MT, true><<<up_grid, kGemvThreads, 0, stream>>>(up);
  check_launch("fused_moe (gate/up)");
  const dim3 down_grid(
      static_cast<unsigned>(std::max<int64_t>(1, ceil_div(down.cols, 2 * kGemvGroups))),
      static_cast<unsigned>(down.experts));
  moe_gemv_kernel<T, float, MT, false><<<down_grid, kGemvThreads, 0, stream>>>(down);
  check_launch("fused_moe (down)");
}

constexpr int64_t kChunkBytes = int64_t{256} << 20;  // float32 A and Y per token chunk

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

void topk_routing(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& router_logits, int64_t top_k, RoutingMode mode,
                  bool renormalize) {
  const int64_t tokens = router_logits.size(0), experts = router_logits.size(1);
  if (tokens == 0) return;
  const int warps = kRoutingThreads / kWarpSize;
  const int64_t blocks = std::min<int64_t>(ceil_div(tokens, warps), int64_t{1} << 30);
  dispatch_floating(router_logits.dtype, [&](auto tag) {
    using T = decltype(tag);
    topk_routing_kernel<T><<<static_cast<unsigned>(blocks), kRoutingThreads, 0,
                             stream_of(router_logits.stream)>>>(
        data<float>(topk_weights), data<int32_t>(topk_ids), data<T>(router_logits), tokens,
        experts, static_cast<int>(top_k), mode == RoutingMode::SoftmaxTopk, renormalize);
  });
  check_launch("topk_routing");
}

void fused_moe(const TensorView& out, const TensorView& hidden, const TensorView& w13,
               const TensorView& w2, const TensorView& topk_weights, const TensorView& topk_ids,
               Activation activation, GateUpLayout gate_up_layout, const TensorView* w13_bias,
               const TensorView* w2_bias, const TensorView* w13_scales,
               const TensorView* w2_scales) {
  const int64_t tokens = hidden.size(0), H = hidden.size(1), top_k = topk_ids.size(1);
  const int64_t E = w13.size(0), I = w13.size(1) / 2;
  if (tokens == 0 || H == 0) return;
  // moe_combine_kernel orders a token's pairs in shared arrays of kMaxTopK entries; the host
  // checks do not bound fused_moe's top_k (only topk_routing's), so refuse more here.
  if (top_k > kMaxTopK) {
    raise<ValueError>("topk_ids: the GPU kernels take at most ", kMaxTopK,
                      " experts per token (its second size), got ", top_k);
  }
  const bool mxfp4 = w13.dtype == DType::UInt8;
  // The decode path (moe_gemv_kernel): MXFP4, few tokens, 16-byte aligned weights (uint4 loads).
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool gemv_ok = mxfp4 && E <= 65535 && aligned16(w13.data) && aligned16(w2.data);
  const hipStream_t stream = stream_of(hidden.stream);

  // Token chunks bound the float32 buffers A [P, I] and Y [P, H].
  const int64_t per_token = std::max<int64_t>(1, top_k * (I + H) * static_cast<int64_t>(sizeof(float)));
  const int64_t chunk = std::max<int64_t>(1, std::min(tokens, kChunkBytes / per_token));
  const int64_t max_pairs = chunk * top_k;

  const size_t counts_bytes = align_up(sizeof(int32_t) * E);
  const size_t offsets_bytes = align_up(sizeof(int32_t) * (E + 1));
  const size_t pairs_bytes = align_up(sizeof(int32_t) * max_pairs);
  const size_t a_bytes = align_up(sizeof(float) * max_pairs * I);
  const size_t y_bytes = align_up(sizeof(float) * max_pairs * H);
  char* ws = static_cast<char*>(workspace(counts_bytes + 2 * offsets_bytes + 2 * pairs_bytes +
                                          a_bytes + y_bytes));
  int32_t* counts = reinterpret_cast<int32_t*>(ws);
  int32_t* offsets = reinterpret_cast<int32_t*>(ws + counts_bytes);
  int32_t* tile_offsets = reinterpret_cast<int32_t*>(ws + counts_bytes + offsets_bytes);
  int32_t* sorted_pair = reinterpret_cast<int32_t*>(ws + counts_bytes + 2 * offsets_bytes);
  int32_t* pair_pos = reinterpret_cast<int32_t*>(ws + counts_bytes + 2 * offsets_bytes + pairs_bytes);
  float* a_buf = reinterpret_cast<float*>(ws + counts_bytes + 2 * offsets_bytes + 2 * pairs_bytes);
  float* y_buf = reinterpret_cast<float*>(ws + counts_bytes + 2 * offsets_bytes + 2 * pairs_bytes +
                                          a_bytes);

  const int32_t* ids_all = data<const int32_t>(topk_ids);
  const float* routing_all = data<const float>(topk_weights);
  const void* b13 = w13_bias ? w13_bias->data : nullptr;
  const void* b2 = w2_bias ? w2_bias->data : nullptr;
  const uint8_t* s13 = w13_scales ? data<const uint8_t>(*w13_scales) : nullptr;
  const uint8_t* s2 = w2_scales ? data<const uint8_t>(*w2_scales) : nullptr;

  dispatch_floating(hidden.dtype, [&](auto tag) {
    using T = decltype(tag);
    for (int64_t c0 = 0; c0 < tokens; c0 += chunk) {
      const int64_t n = std::min(chunk, tokens - c0), pairs = n * top_k;
      const int32_t* ids = ids_all + c0 * top_k;
      if (pairs > 0) {
        check(hipMemsetAsync(counts, 0, sizeof(int32_t) * E, stream), "fused_moe: memset");
        check(hipMemsetAsync(pair_pos, 0xff, sizeof(int32_t) * pairs, stream), "fused_moe: memset");
        const int64_t count_blocks = std::min<int64_t>(ceil_div(pairs, kSortThreads), 4096);
        moe_count_kernel<<<static_cast<unsigned>(count_blocks), kSortThreads, 0, stream>>>(
            counts, ids, pairs, E);
        moe_scan_kernel<<<1, kSortThreads, 0, stream>>>(offsets, tile_offsets, counts, E, kBM);
        moe_place_kernel<<<static_cast<unsigned>(E), kSortThreads, 0, stream>>>(
            sorted_pair, pair_pos, ids, offsets, pairs);
        check_launch("fused_moe (sort)");

        const bool decode = gemv_ok && n <= kGemvMaxTokens;
        // Every expert with pairs adds at most one partial tile.
        const int64_t max_tiles = ceil_div(pairs, kBM) + std::min(E, pairs);
        GemmArgs up{};
        up.x = data<const T>(hidden) + c0 * H;
        up.sorted_pair = sorted_pair;
        up.top_k = top_k;
        up.w = w13.data;
        up.scales = s13;
        up.bias = b13;
        up.rows = 2 * I;
        up.K = H;
        up.cols = I;
        up.offsets = offsets;
        up.tile_offsets = tile_offsets;
        up.experts = E;
        up.out = a_buf;
        up.interleaved = gate_up_layout == GateUpLayout::Interleaved;
        up.swiglu_oai = activation == Activation::SwigluOai;
        GemmArgs down = up;
        down.x = a_buf;
        down.sorted_pair = nullptr;
        down.w = w2.data;
        down.scales = s2;
        down.bias = b2;
        down.rows = H;
        down.K = I;
        down.cols = H;
        down.out = y_buf;
        if (decode) {
          // Up to kGemvMaxTokens tokens: MT bounds the pairs per chunk (an expert's pairs are
          // usually at most the tokens; more go through in further chunks in the kernel).
          if (n <= 1) {
            launch_moe_gemv<T, 1>(up, down, stream);
          } else if (n <= 4) {
            launch_moe_gemv<T, 4>(up, down, stream);
          } else {
            launch_moe_gemv<T, 16>(up, down, stream);
          }
        } else {
          const dim3 up_grid(static_cast<unsigned>(max_tiles),
                             static_cast<unsigned>(ceil_div(I, kBN / 2)));
          if (mxfp4) {
            moe_gemm_kernel<T, T, true, true><<<up_grid, kGemmThreads, 0, stream>>>(up);
          } else {
            moe_gemm_kernel<T, T, false, true><<<up_grid, kGemmThreads, 0, stream>>>(up);
          }
          check_launch("fused_moe (gate/up)");

          const dim3 down_grid(static_cast<unsigned>(max_tiles),
                               static_cast<unsigned>(ceil_div(H, kBN)));
          if (mxfp4) {
            moe_gemm_kernel<T, float, true, false><<<down_grid, kGemmThreads, 0, stream>>>(down);
          } else {
            moe_gemm_kernel<T, float, false, false><<<down_grid, kGemmThreads, 0, stream>>>(down);
          }
          check_launch("fused_moe (down)");
        }
      }
      const dim3 combine_grid(static_cast<unsigned>(n),
                              static_cast<unsigned>(ceil_div(H, kCombineThreads)));
      moe_combine_kernel<T><<<combine_grid, kCombineThreads, 0, stream>>>(
          data<T>(out) + c0 * H, y_buf, pair_pos, routing_all + c0 * top_k, top_k, H);
      check_launch("fused_moe (combine)");
    }
  });
}

}  // namespace gnomon::gpu
