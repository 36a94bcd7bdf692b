// MXFP4 (OCP MX v1.0) on the GPU: quantize, dequantize, and a GEMM that dequantises in registers.
//
// Layout as on the CPU (csrc/cpu/mxfp4.cpp): a row of K elements is K/32 blocks; block b has 16
// bytes of E2M1 codes (element 2i in the low nibble of byte i, so element e sits at bit 4e of the
// block's 128 bits) and one E8M0 scale byte. Element and scale rules come from core/scalar_math.h,
// shared with the CPU kernels, so both sides quantize bit for bit alike.
//
// Decomposition:
// - quantize: one thread per packed byte (two elements); the 16 threads of an MX block find its
//   largest magnitude with shuffles (16-lane groups, whatever the warp width), then each encodes
//   its pair and the group's first thread writes the scale. Loads and stores are coalesced.
// - dequantize: one thread per packed byte, writing its two elements.
// - gemm, M <= 16 (decode) and a 16-byte aligned weight: GEMV-style. Each weight row belongs to a
//   group of 16 lanes; per K chunk of 512 elements each lane loads one whole MX block (one 16-byte
//   load of codes plus its scale byte, so a row group reads 256 contiguous bytes), decodes the 32
//   nibbles in registers and multiplies them with the chunk of all M activation rows, staged in
//   shared memory as float32. Every weight byte is read once per call for all M rows; the next
//   chunk's codes are loaded before the current chunk is computed. The 16 lanes' partial sums are
//   reduced with shuffles at the end.
// - gemm otherwise: shared-memory tiles of 64 x 64 outputs, K steps of 64 (two MX blocks). Each
//   step stages a tile of `a` (as float32) and the weight tile dequantised in registers (code *
//   scale, float32) into shared memory; 256 threads each accumulate a 4 x 4 output block with FMAs
//   in float registers. The global loads of the next step are issued before computing this one.
//   Matrix-core MMA (bf16 WMMA/MFMA on the dequantised tile) is a later optimisation.
// No full-precision copy of the weight is ever written to global memory. Sums are float32; the
// bias is added in float32 and the result rounded to out's dtype once, as on the CPU.
#include "gpu.h"
#include "kernels.h"

namespace gnomon::gpu {
namespace {

using math::kMxfp4BlockSize;
constexpr int kBlockBytes = kMxfp4BlockSize / 2;

// ---- shared helpers --------------------------------------------------------------------------

// out/bias dtypes are independent of a's (ops.cpp checks each as floating), so the epilogue
// converts by a runtime switch rather than multiplying the kernel instantiations.
__device__ __forceinline__ float load_as(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::BFloat16: return to_float(static_cast<const Bf16*>(p)[i]);
    case DType::Float16: return to_float(static_cast<const Fp16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_as(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::BFloat16: static_cast<Bf16*>(p)[i] = from_float<Bf16>(v); break;
    case DType::Float16: static_cast<Fp16*>(p)[i] = from_float<Fp16>(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// ---- quantize / dequantize -----------------------------------------------------------------

constexpr int kElementwiseThreads = 256;  // a multiple of 16, so MX blocks never straddle blocks

// Thread `idx` owns packed byte idx: elements 2*idx and 2*idx + 1 of the flat [N*K] input; MX
// block idx / 16 (the flat layout matches the CPU, which also walks the tensor as flat blocks).
template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    mxfp4_quantize_kernel(uint8_t* __restrict__ packed, uint8_t* __restrict__ scales,
                          const T* __restrict__ x, int64_t bytes, math::ScaleRule rule) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = idx < bytes;
  const float v0 = valid ? to_float(x[2 * idx]) : 0.f;
  const float v1 = valid ? to_float(x[2 * idx + 1]) : 0.f;
  // The largest magnitude as bits (integer order is float order for |x|; >= the infinity pattern
  // is Inf or NaN). Fits in a non-negative int, so a signed max works.
  int amax = static_cast<int>(math::float_to_bits(v0) & 0x7fffffffu);
  const int other = static_cast<int>(math::float_to_bits(v1) & 0x7fffffffu);
  amax = other > amax ? other : amax;
  // Butterfly over the 16 threads of the MX block; every lane of the warp takes part. Groups are
  // 16-aligned within the warp and all-valid or all-invalid (bytes is a multiple of 16).
#pragma unroll
  for (int offset = kBlockBytes / 2; offset > 0; offset /= 2) {
    const int o = shfl_xor(amax, offset);
    amax = o > amax ? o : amax;
  }
  if (!valid) return;
  const uint32_t amax_bits = static_cast<uint32_t>(amax);
  uint8_t scale, byte;
  if (amax_bits >= 0x7f800000u) {  // NaN or Inf: the NaN scale and zero codes
    scale = math::kE8M0NaN;
    byte = 0;
  } else {
    // All-zero block: scale 0x00, elements keep their (signed) zero codes.
    scale = amax_bits == 0 ? 0 : math::mxfp4_scale_byte(math::bits_to_float(amax_bits), rule);
    // 2^(127 - scale), normal for every byte the rules produce (<= 253): exact division.
    const float inverse = math::bits_to_float(static_cast<uint32_t>(254 - scale) << 23);
    byte = static_cast<uint8_t>(math::float_to_e2m1(v0 * inverse) |
                                (math::float_to_e2m1(v1 * inverse) << 4));
  }
  packed[idx] = byte;
  if (idx % kBlockBytes == 0) scales[idx / kBlockBytes] = scale;
}

template <typename T>
__global__ void __launch_bounds__(kElementwiseThreads)
    mxfp4_dequantize_kernel(T* __restrict__ out, const uint8_t* __restrict__ packed,
                            const uint8_t* __restrict__ scales, int64_t bytes) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= bytes) return;
  const uint32_t byte = packed[idx];
  const float scale = math::e8m0_to_float(scales[idx / kBlockBytes]);  // 0xFF: NaN
  out[2 * idx] = from_float<T>(decode_e2m1(byte) * scale);
  out[2 * idx + 1] = from_float<T>(decode_e2m1(byte >> 4) * scale);
}

// ---- GEMM, small M: GEMV-style ---------------------------------------------------------------

constexpr int kGemvThreads = 128;
constexpr int kGemvLanesPerRow = 16;                                     // lanes per weight row
constexpr int kGemvRows = kGemvThreads / kGemvLanesPerRow;              // weight rows per block
constexpr int kGemvChunkBlocks = kGemvLanesPerRow;                      // one MX block per lane
constexpr int kGemvChunk = kGemvChunkBlocks * kMxfp4BlockSize;          // K elements per chunk
// Shared-memory slot of one MX block of one activation row: 32 floats plus 4 of padding, so the
// float4 reads of lanes on different blocks fall in different banks.
constexpr int kGemvSlot = kMxfp4BlockSize + 4;
constexpr int kGemvRowFloats = kGemvChunkBlocks * kGemvSlot;
constexpr int kGemvMaxM = 16;

// Sums the lane's MX block against the activation rows: acc[m] += scale * sum_e w[e] * a[m][e].
// Each product is exact-code times activation and the block's power-of-two scale is applied once
// to the block sum: the same value as the CPU's (code * scale) * a products except for float
// over/underflow at the extremes of the scale range.
template <int MT>
__device__ __forceinline__ void gemv_block(const uint4& codes, uint8_t scale_byte,
                                           const float* a_slot, int m_rows, float (&acc)[MT]) {
  float w[kMxfp4BlockSize];
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int e = 0; e < kMxfp4BlockSize; ++e) w[e] = decode_e2m1(words[e / 8] >> (4 * (e % 8)));
  const float scale = math::e8m0_to_float(scale_byte);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m < m_rows) {
      const float* as = a_slot + m * kGemvRowFloats;
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int q = 0; q < kMxfp4BlockSize / 4; ++q) {
        const float4 x = *reinterpret_cast<const float4*>(as + 4 * q);
        s0 = fmaf(w[4 * q], x.x, s0);
        s1 = fmaf(w[4 * q + 1], x.y, s1);
        s0 = fmaf(w[4 * q + 2], x.z, s0);
        s1 = fmaf(w[4 * q + 3], x.w, s1);
      }
      acc[m] = fmaf(s0 + s1, scale, acc[m]);
    }
  }
}

// Block: kGemvRows weight rows, 16 lanes each (a 32-lane warp holds 2 rows, a 64-lane one 4).
// MT (1, 2, 4, 8 or 16) bounds m_rows; the activations' chunk is staged for all rows at once.
// `w` must be 16-byte aligned (its row stride K/2 is a multiple of 16).
template <typename T, int MT>
__global__ void __launch_bounds__(kGemvThreads)
    mxfp4_gemv_kernel(void* __restrict__ out, DType out_dtype, const T* __restrict__ a,
                      const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scales,
                      const void* __restrict__ bias, DType bias_dtype, int m_rows, int64_t n,
                      int64_t k) {
  __shared__ __align__(16) float a_s[MT * kGemvRowFloats];
  const int tid = threadIdx.x;
  const int sub = tid % kGemvLanesPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvRows + tid / kGemvLanesPerRow;
  const bool row_ok = row < n;
  const int64_t row_blocks = k / kMxfp4BlockSize;
  const uint4* w_row = reinterpret_cast<const uint4*>(w + (row_ok ? row : 0) * (k / 2));
  const uint8_t* s_row = w_scales + (row_ok ? row : 0) * row_blocks;
  const int64_t chunks = (row_blocks + kGemvChunkBlocks - 1) / kGemvChunkBlocks;

  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[m] = 0.f;

  // The lane's block in chunk c; lanes past the end of K (last chunk) or of N do nothing.
  auto lane_block = [&](int64_t c) { return c * kGemvChunkBlocks + sub; };
  auto has_block = [&](int64_t c) { return row_ok && lane_block(c) < row_blocks; };
  uint4 codes = make_uint4(0, 0, 0, 0);
  uint8_t scale = 0;
  if (has_block(0)) {
    codes = w_row[lane_block(0)];
    scale = s_row[lane_block(0)];
  }
  for (int64_t c = 0; c < chunks; ++c) {
    __syncthreads();  // the previous chunk's reads of a_s are done
    const int64_t k0 = c * kGemvChunk;
    for (int i = tid; i < MT * kGemvChunk; i += kGemvThreads) {
      const int m = i / kGemvChunk, j = i % kGemvChunk;
      float v = 0.f;
      if (m < m_rows && k0 + j < k) v = to_float(a[m * k + k0 + j]);
      a_s[m * kGemvRowFloats + (j / kMxfp4BlockSize) * kGemvSlot + j % kMxfp4BlockSize] = v;
    }
    __syncthreads();
    // Issue the next chunk's weight loads before computing this one.
    uint4 next_codes = make_uint4(0, 0, 0, 0);
    uint8_t next_scale = 0;
    if (has_block(c + 1)) {
      next_codes = w_row[lane_block(c + 1)];
      next_scale = s_row[lane_block(c + 1)];
    }
    if (has_block(c)) gemv_block<MT>(codes, scale, a_s + sub * kGemvSlot, m_rows, acc);
    codes = next_codes;
    scale = next_scale;
  }

  // Reduce over the row's 16 lanes (xor offsets below 16 stay inside the group and the warp).
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int offset = kGemvLanesPerRow / 2; offset > 0; offset /= 2) {
      acc[m] += shfl_xor(acc[m], offset);
    }
  }
  if (!row_ok || sub != 0) return;
  const float b = bias != nullptr ? load_as(bias, bias_dtype, row) : 0.f;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m < m_rows) store_as(out, out_dtype, m * n + row, bias != nullptr ? acc[m] + b : acc[m]);
  }
}

// ---- GEMM, general M: shared-memory tiles ----------------------------------------------------

constexpr int kTileM = 64, kTileN = 64, kTileK = 64;  // kTileK = two MX blocks
constexpr int kTileThreads = 256;                      // 16 x 16 threads, 4 x 4 outputs each
constexpr int kTilePad = 4;                            // keeps float4 alignment, spreads banks
// Loader roles: thread -> (tile row tid / 4, 16-element quarter tid % 4 of the K step).
constexpr int kLoadQuarter = kTileK / 4;

template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    mxfp4_gemm_tiled_kernel(void* __restrict__ out, DType out_dtype, const T* __restrict__ a,
                            const uint8_t* __restrict__ w, const uint8_t* __restrict__ w_scales,
                            const void* __restrict__ bias, DType bias_dtype, int64_t m_rows,
                            int64_t n, int64_t k) {
  // K-major tiles: a_s[kk][m], w_s[kk][n] (w_s holds code * scale as float32).
  __shared__ __align__(16) float a_s[kTileK][kTileM + kTilePad];
  __shared__ __align__(16) float w_s[kTileK][kTileN + kTilePad];
  const int tid = threadIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t row_blocks = k / kMxfp4BlockSize;
  const int64_t steps = (k + kTileK - 1) / kTileK;

  const int load_row = tid / 4, load_q = tid % 4;
  const int64_t a_row = m0 + load_row, w_row = n0 + load_row;

  // One step's global data, held in registers between the load and the shared-memory store.
  float a_reg[kLoadQuarter];
  uint32_t w_words[kLoadQuarter / 8];  // the quarter's 8 code bytes, element e at bit 4e
  uint32_t w_scale = 0;  // the quarter's scale byte
  int w_ok = 0;          // whether the quarter lies inside the weight (else it stages zeros)
  auto load = [&](int64_t step) {
    const int64_t kq = step * kTileK + load_q * kLoadQuarter;  // first K index of the quarter
    // K is a multiple of 32, so a 16-element quarter is wholly inside or outside K.
    const bool k_ok = kq < k;
    const bool a_ok = k_ok && a_row < m_rows;
#pragma unroll
    for (int e = 0; e < kLoadQuarter; ++e) a_reg[e] = a_ok ? to_float(a[a_row * k + kq + e]) : 0.f;
    w_ok = k_ok && w_row < n ? 1 : 0;
    if (w_ok) {
      const uint8_t* src = w + w_row * (k / 2) + kq / 2;
      // Byte loads: the op does not require `w` to be aligned on this path.
#pragma unroll
      for (int i = 0; i < kLoadQuarter / 8; ++i) {
        w_words[i] = static_cast<uint32_t>(src[4 * i]) |
                     (static_cast<uint32_t>(src[4 * i + 1]) << 8) |
                     (static_cast<uint32_t>(src[4 * i + 2]) << 16) |
                     (static_cast<uint32_t>(src[4 * i + 3]) << 24);
      }
      w_scale = w_scales[w_row * row_blocks + kq / kMxfp4BlockSize];
    }
  };
  auto stage = [&]() {
    const int kk0 = load_q * kLoadQuarter;
#pragma unroll
    for (int e = 0; e < kLoadQuarter; ++e) a_s[kk0 + e][load_row] = a_reg[e];
    if (w_ok) {
      const float scale = math::e8m0_to_float(static_cast<uint8_t>(w_scale));
#pragma unroll
      for (int e = 0; e < kLoadQuarter; ++e) {
        w_s[kk0 + e][load_row] = decode_e2m1(w_words[e / 8] >> (4 * (e % 8))) * scale;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kLoadQuarter; ++e) w_s[kk0 + e][load_row] = 0.f;
    }
  };

  const int tx = tid % 16, ty = tid / 16;  // outputs rows ty*4.., columns tx*4..
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  }

  if (steps > 0) load(0);
  for (int64_t step = 0; step < steps; ++step) {
    stage();
    __syncthreads();
    if (step + 1 < steps) load(step + 1);  // overlaps with the FMAs below
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 av = *reinterpret_cast<const float4*>(&a_s[kk][ty * 4]);
      const float4 wv = *reinterpret_cast<const float4*>(&w_s[kk][tx * 4]);
      const float ar[4] = {av.x, av.y, av.z, av.w};
      const float wr[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(ar[i], wr[j], acc[i][j]);
      }
    }
    __syncthreads();  // before the next stage() overwrites the tiles
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty * 4 + i;
    if (row >= m_rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      if (col >= n) continue;
      const float v = bias != nullptr ? acc[i][j] + load_as(bias, bias_dtype, col) : acc[i][j];
      store_as(out, out_dtype, row * n + col, v);
    }
  }
}

void check_grid(int64_t blocks, const char* op) {
  if (blocks > 0x7fffffff) raise<ValueError>(op, ": input too large for one launch");
}

template <typename T, int MT>
void launch_gemv(const TensorView& out, const TensorView& a, const TensorView& w,
                 const TensorView& w_scales, const TensorView* bias, int m, int64_t n,
                 int64_t k) {
  const int64_t grid = ceil_div(n, kGemvRows);
  check_grid(grid, "mxfp4_gemm");
  mxfp4_gemv_kernel<T, MT><<<static_cast<unsigned>(grid), kGemvThreads, 0, stream_of(a.stream)>>>(
      out.data, out.dtype, data<const T>(a), data<const uint8_t>(w),
      data<const uint8_t>(w_scales), bias != nullptr ? bias->data : nullptr,
      bias != nullptr ? bias->dtype : DType::Float32, m, n, k);
}

}  // namespace

void mxfp4_quantize(const TensorView& packed, const TensorView& scales, const TensorView& x,
                    ScaleRule scale_rule) {
  const int64_t bytes = x.numel() / 2;
  if (bytes == 0) return;
  const int64_t grid = ceil_div(bytes, kElementwiseThreads);
  check_grid(grid, "mxfp4_quantize");
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    mxfp4_quantize_kernel<T><<<static_cast<unsigned>(grid), kElementwiseThreads, 0,
                               stream_of(x.stream)>>>(data<uint8_t>(packed),
                                                      data<uint8_t>(scales), data<const T>(x),
                                                      bytes, scale_rule);
  });
  check_launch("mxfp4_quantize");
}

void mxfp4_dequantize(const TensorView& out, const TensorView& packed, const TensorView& scales) {
  const int64_t bytes = out.numel() / 2;
  if (bytes == 0) return;
  const int64_t grid = ceil_div(bytes, kElementwiseThreads);
  check_grid(grid, "mxfp4_dequantize");
  dispatch_floating(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    mxfp4_dequantize_kernel<T><<<static_cast<unsigned>(grid), kElementwiseThreads, 0,
                                 stream_of(packed.stream)>>>(data<T>(out),
                                                             data<const uint8_t>(packed),
                                                             data<const uint8_t>(scales), bytes);
  });
  check_launch("mxfp4_dequantize");
}

void mxfp4_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                const TensorView& w_scales, const TensorView* bias) {
  const int64_t m = a.size(0), k = a.size(1), n = w.size(0);
  if (m == 0 || n == 0) return;
  const bool w_aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  dispatch_floating(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (m <= kGemvMaxM && w_aligned) {
      const int mi = static_cast<int>(m);
      if (mi <= 1) {
        launch_gemv<T, 1>(out, a, w, w_scales, bias, mi, n, k);
      } else if (mi <= 2) {
        launch_gemv<T, 2>(out, a, w, w_scales, bias, mi, n, k);
      } else if (mi <= 4) {
        launch_gemv<T, 4>(out, a, w, w_scales, bias, mi, n, k);
      } else if (mi <= 8) {
        launch_gemv<T, 8>(out, a, w, w_scales, bias, mi, n, k);
      } else {
        launch_gemv<T, 16>(out, a, w, w_scales, bias, mi, n, k);
      }
      return;
    }
    const int64_t grid_n = ceil_div(n, kTileN), grid_m = ceil_div(m, kTileM);
    check_grid(grid_n, "mxfp4_gemm");
    if (grid_m > 65535) raise<ValueError>("mxfp4_gemm: too many rows of a for one launch");
    const dim3 grid(static_cast<unsigned>(grid_n), static_cast<unsigned>(grid_m));
    mxfp4_gemm_tiled_kernel<T><<<grid, kTileThreads, 0, stream_of(a.stream)>>>(
        out.data, out.dtype, data<const T>(a), data<const uint8_t>(w),
        data<const uint8_t>(w_scales), bias != nullptr ? bias->data : nullptr,
        bias != nullptr ? bias->dtype : DType::Float32, m, n, k);
  });
  check_launch("mxfp4_gemm");
}

}  // namespace gnomon::gpu
