// rms_norm (optionally fused with the residual add) and the backend's identity.
#include "gpu.h"
#include "kernels.h"

namespace gnomon::gpu {

const char* backend() {
#if defined(GNOMON_GPU_AMD)
  return "hip";
#else
  return "cuda";
#endif
}

const char* architectures() { return GNOMON_GPU_ARCHS; }

namespace {

constexpr int kNormThreads = 256;

// One block per row. With a residual: residual += x (stored back, rounded to T, as the CPU op
// does) and out = norm(residual) * weight; without: out = norm(x) * weight. Sums in float.
template <typename T>
__global__ void rms_norm_kernel(T* __restrict__ out, const T* __restrict__ x,
                                const T* __restrict__ weight, T* __restrict__ residual,
                                int64_t hidden, float eps) {
  __shared__ float scratch[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  T* rr = residual ? residual + row * hidden : nullptr;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = to_float(xr[i]);
    if (rr) {
      const T stored = from_float<T>(v + to_float(rr[i]));
      rr[i] = stored;
      v = to_float(stored);
    }
    sum += v * v;
  }
  const float total = block_sum(sum, scratch);
  const float inv = rsqrtf(total / static_cast<float>(hidden) + eps);
  const T* src = rr ? rr : xr;
  T* dst = out + row * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    dst[i] = from_float<T>(to_float(src[i]) * inv * to_float(weight[i]));
  }
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
              const TensorView* residual) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  if (rows == 0) return;
  dispatch_floating(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<rows, kNormThreads, 0, stream_of(x.stream)>>>(
        data<T>(out), data<T>(x), data<T>(weight), residual ? data<T>(*residual) : nullptr,
        hidden, static_cast<float>(eps));
  });
  check_launch("rms_norm");
}

}  // namespace gnomon::gpu
