#pragma once
// The one portability header of gnomon's single-source GPU kernels. On AMD (hipcc) it is HIP
// itself; on NVIDIA (nvcc) it maps the HIP subset gnomon uses onto CUDA, and nothing more.
// Kernels include this header and csrc/core/scalar_math.h (the math the CPU kernels share).
#include <cstdint>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define GNOMON_GPU_AMD 1
#else
#include <cuda_runtime.h>
#define GNOMON_GPU_NVIDIA 1

using hipStream_t = cudaStream_t;
using hipError_t = cudaError_t;
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipStreamSynchronize cudaStreamSynchronize
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#endif

#include "core/errors.h"
#include "core/scalar_math.h"
#include "core/tensor.h"

namespace gnomon::gpu {

// Warp (wavefront) size as a compile-time constant of the target: 64 on CDNA, 32 on NVIDIA.
// Device code uses kWarpSize; host code must not size launches by it (the host pass of an AMD
// build sees no target and takes 64).
#if defined(GNOMON_GPU_AMD)
#if defined(__GFX9__) || !defined(__HIP_DEVICE_COMPILE__)
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;  // RDNA (wave32); gnomon targets CDNA, this keeps it compiling
#endif
#else
constexpr int kWarpSize = 32;
#endif

// 64-bit ballot masks everywhere, so the same code serves both widths.
using LaneMask = unsigned long long;

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
#if defined(GNOMON_GPU_AMD)
  return __shfl_xor(v, lane_mask, kWarpSize);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, kWarpSize);
#endif
}

__device__ __forceinline__ int shfl_xor(int v, int lane_mask) {
#if defined(GNOMON_GPU_AMD)
  return __shfl_xor(v, lane_mask, kWarpSize);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, kWarpSize);
#endif
}

__device__ __forceinline__ float shfl(float v, int src_lane) {
#if defined(GNOMON_GPU_AMD)
  return __shfl(v, src_lane, kWarpSize);
#else
  return __shfl_sync(0xffffffffu, v, src_lane, kWarpSize);
#endif
}

__device__ __forceinline__ LaneMask ballot(bool predicate) {
#if defined(GNOMON_GPU_AMD)
  return static_cast<LaneMask>(__ballot(predicate));
#else
  return static_cast<LaneMask>(__ballot_sync(0xffffffffu, predicate));
#endif
}

// Butterfly reductions over the whole warp; the depth follows kWarpSize.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += shfl_xor(v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, shfl_xor(v, offset));
  return v;
}

// Block-wide sum for blockDim.x a multiple of kWarpSize (at most 1024 threads); every thread
// gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = -INFINITY;
  for (int w = 0; w < warps; ++w) total = fmaxf(total, scratch[w]);
  return total;
}

inline hipStream_t stream_of(uintptr_t handle) { return reinterpret_cast<hipStream_t>(handle); }

// Raises a RuntimeError naming the op when a launch failed.
inline void check_launch(const char* op) {
  const hipError_t err = hipGetLastError();
  if (err != hipSuccess) {
    raise<std::runtime_error>(op, ": GPU kernel launch failed: ", hipGetErrorString(err));
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch device memory for one launch sequence (split-K partials, MoE token lists), per device
// and per host thread, grown when a call needs more. Growing waits for the device first, so no
// kernel still reads the old buffer. Calls on one thread use one stream at a time (torch's
// current stream), so reusing the buffer between consecutive launches on it is safe.
// Raises a RuntimeError naming `what` when a runtime call failed.
inline void check(hipError_t err, const char* what) {
  if (err != hipSuccess) raise<std::runtime_error>(what, ": ", hipGetErrorString(err));
}

inline void* workspace(size_t bytes) {
  constexpr int kMaxDevices = 64;
  thread_local void* buffers[kMaxDevices] = {};
  thread_local size_t sizes[kMaxDevices] = {};
  int device = 0;
  check(hipGetDevice(&device), "GPU workspace: hipGetDevice");
  if (device < 0 || device >= kMaxDevices) {
    raise<std::runtime_error>("GPU workspace: device index ", device, " out of range");
  }
  if (sizes[device] < bytes) {
    check(hipDeviceSynchronize(), "GPU workspace: synchronize before growing");
    if (buffers[device] != nullptr) check(hipFree(buffers[device]), "GPU workspace: free");
    buffers[device] = nullptr;
    sizes[device] = 0;
    const size_t grown = bytes + bytes / 2;
    check(hipMalloc(&buffers[device], grown), "GPU workspace: allocate");
    sizes[device] = grown;
  }
  return buffers[device];
}

}  // namespace gnomon::gpu

namespace gnomon::gpu {

// Element types as kernels see them: float, and bf16/fp16 stored as uint16_t and converted with
// the shared round-to-nearest-even code (no hip_bf16.h / cuda_bf16.h needed).
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(Bf16 v) { return math::bf16_to_float(v.bits); }
__device__ __forceinline__ float to_float(Fp16 v) { return math::fp16_to_float(v.bits); }

template <typename T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ Bf16 from_float<Bf16>(float f) {
  return Bf16{math::float_to_bf16(f)};
}
template <>
__device__ __forceinline__ Fp16 from_float<Fp16>(float f) {
  return Fp16{math::float_to_fp16(f)};
}

// The E2M1 code in the low nibble of `nibble` (upper bits ignored) as a float, with the same
// values as math::e2m1_to_float, by bit assembly: codes with an exponent field e >= 1 are the
// float 2^(e-1) * (1 + m/2), i.e. bits ((e,m) << 22) + (126 << 23); magnitude codes 0 and 1 (0
// and 0.5) are special-cased; bit 3 is the sign (code 8 is -0.0, as on the CPU).
__device__ __forceinline__ float decode_e2m1(uint32_t nibble) {
  const uint32_t magnitude = nibble & 7u;
  uint32_t bits = (magnitude << 22) + 0x3f000000u;
  bits = magnitude < 2u ? magnitude * 0x3f000000u : bits;
  bits |= (nibble & 8u) << 28;
  return math::bits_to_float(bits);
}

// Calls fn(T{}) with T the element type of `dtype` (float32, bfloat16 or float16).
template <typename Fn>
void dispatch_floating(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: return fn(float{});
    case DType::BFloat16: return fn(Bf16{});
    case DType::Float16: return fn(Fp16{});
    default: raise<TypeError>("GPU kernels take float32, bfloat16 or float16, got ", dtype_name(dtype));
  }
}

template <typename T>
inline T* data(const TensorView& t) {
  return static_cast<T*>(t.data);
}

}  // namespace gnomon::gpu
