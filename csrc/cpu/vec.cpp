#include "cpu/vec.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "core/parallel.h"
#include "core/threads.h"
#include "core/scalar_math.h"

#if GNOMON_HAS_WIDE_KERNELS && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace gnomon::cpu {
namespace {

GNOMON_SIMD_CLONES void bf16_to_floats(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::bf16_to_float(src[i]);
}

GNOMON_SIMD_CLONES void floats_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::float_to_bf16(src[i]);
}

GNOMON_SIMD_CLONES void fp16_to_floats(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::fp16_to_float(src[i]);
}

void floats_to_fp16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = math::float_to_fp16(src[i]);
}

#if GNOMON_HAS_WIDE_KERNELS
// dst[c][r] = src[r][c] for r < n and c < cols, 32-bit words in 16 x 16 blocks: src rows
// (src_stride words apart) are read to cols rounded up to 16, and dst rows (dst_stride apart)
// are written to n rounded up to 16, zeros past n.
GNOMON_TARGET_WIDE void transpose_words_wide(const uint32_t* src, int64_t n, int64_t cols,
                                             int64_t src_stride, uint32_t* dst,
                                             int64_t dst_stride) {
  for (int64_t r0 = 0; r0 < n; r0 += 16) {
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      Wide::U m[16];
      for (int64_t i = 0; i < 16; ++i) {
        m[i] = r0 + i < n ? load<Wide::U>(src + (r0 + i) * src_stride + c0) : Wide::U{};
      }
      transpose16(m);
      for (int64_t i = 0; i < 16 && c0 + i < cols; ++i) {
        store(dst + (c0 + i) * dst_stride + r0, m[i]);
      }
    }
  }
}
#endif

}  // namespace

void load_floats(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::BFloat16: bf16_to_floats(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::Float16: fp16_to_floats(static_cast<const uint16_t*>(src), dst, n); return;
    default: {
      const float* f = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f[i];
    }
  }
}

void store_floats(const float* src, DType dtype, void* dst, int64_t n) {
  switch (dtype) {
    case DType::BFloat16: floats_to_bf16(src, static_cast<uint16_t*>(dst), n); return;
    case DType::Float16: floats_to_fp16(src, static_cast<uint16_t*>(dst), n); return;
    default: {
      float* f = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) f[i] = src[i];
    }
  }
}

// Element by element (only to cols and n) where the kernels are narrow.
void transpose_words(Isa isa, const void* src, int64_t n, int64_t cols, int64_t src_stride,
                     void* dst, int64_t dst_stride) {
  const auto* from = static_cast<const uint32_t*>(src);
  auto* to = static_cast<uint32_t*>(dst);
#if GNOMON_HAS_WIDE_KERNELS
  if (isa != Isa::Narrow) return transpose_words_wide(from, n, cols, src_stride, to, dst_stride);
#endif
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < cols; ++c) to[c * dst_stride + r] = from[r * src_stride + c];
  }
}

// 64 partial sums: four independent vector accumulators on AVX-512 (eight on AVX2), so the adds'
// latency does not bound the loop (16 sums, one zmm chain, ran a 4096-wide row at a quarter of
// the rate).
GNOMON_SIMD_CLONES float dot(const float* a, const float* b, int64_t n) {
  float partial[64] = {};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 64; ++j) partial[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 64; ++j) sum += partial[j];
  return sum;
}

float sum_squares(const float* x, int64_t n) { return dot(x, x, n); }

GNOMON_SIMD_CLONES void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

GNOMON_SIMD_CLONES void scale(float alpha, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

GNOMON_SIMD_CLONES void scale_by(float alpha, const float* w, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * alpha * w[i];
}

#if GNOMON_HAS_WIDE_KERNELS
bool cpu_has_wide() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512cd");
  return has;
}

bool cpu_has_bf16_dot() {
  static const bool has = cpu_has_wide() && __builtin_cpu_supports("avx512bf16");
  return has;
}

#if defined(__linux__)
bool cpu_has_amx() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_bf16_dot() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
    // Linux hands out the tile data state (XFEATURE 18) only to a process that asks for it.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return has;
}
#else
bool cpu_has_amx() { return false; }
#endif
#else
bool cpu_has_wide() { return false; }
bool cpu_has_bf16_dot() { return false; }
bool cpu_has_amx() { return false; }
#endif

Isa kernel_isa() {
  const Isa best = cpu_has_amx()        ? Isa::Amx
                   : cpu_has_bf16_dot() ? Isa::WideBf16
                   : cpu_has_wide()     ? Isa::Wide
                                        : Isa::Narrow;
  const char* cap = std::getenv("GNOMON_CPU_KERNELS");
  if (cap == nullptr || *cap == '\0') return best;
  const std::string name(cap);
  if (name == "narrow") return Isa::Narrow;
  if (name == "wide") return std::min(best, Isa::Wide);
  if (name == "bf16") return std::min(best, Isa::WideBf16);
  raise<ValueError>("GNOMON_CPU_KERNELS: expected 'narrow', 'wide', 'bf16' or unset, got '",
                    name, "'");
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Amx: return "amx-bf16";
    case Isa::WideBf16: return "avx512-bf16";
    case Isa::Wide: return "avx512";
    default: return GNOMON_HAS_SIMD_CLONES && __builtin_cpu_supports("avx2") ? "avx2" : "portable";
  }
}

const char* row_helpers_isa() {
#if GNOMON_HAS_SIMD_CLONES
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2";
#endif
  return "portable";
}

}  // namespace gnomon::cpu

namespace gnomon::cpu {
namespace {

// Independent accumulator chains, enough to cover the FMA latency on every port: the loop is
// nothing but FMAs (or bf16 dot products) on registers, so its rate is the units' peak.
template <typename V, int kChains>
GNOMON_INLINE double fma_rounds(int64_t rounds, float seed) {
  using F = typename V::F;
  F acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = F{} + seed * static_cast<float>(i);
  const F a = F{} + 0.999f, b = F{} + seed;
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 32
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * a + b;
  }
  F total = acc[0];
  for (int i = 1; i < kChains; ++i) total += acc[i];
  return reduce_add(total);
}

GNOMON_SIMD_CLONES double fma_rounds_narrow(int64_t rounds, float seed) {
  return fma_rounds<Narrow, 12>(rounds, seed);
}
#if GNOMON_HAS_WIDE_KERNELS
GNOMON_TARGET_WIDE double fma_rounds_wide(int64_t rounds, float seed) {
  return fma_rounds<Wide, 24>(rounds, seed);
}
GNOMON_TARGET_BF16 double dot_rounds_bf16(int64_t rounds, float seed) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(seed));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(0.25f));
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 total = acc[0];
  for (int i = 1; i < 24; ++i) total = _mm512_add_ps(total, acc[i]);
  return _mm512_reduce_add_ps(total);
}
// Four independent tile accumulators, each TDPBF16PS 16 x 16 x 32 products.
GNOMON_TARGET_AMX double tile_rounds_amx(int64_t rounds, float seed) {
  alignas(64) uint32_t ones[kAmxRows * kAmxPairs];
  for (uint32_t& w : ones) w = 0x3f803f80u;  // two bf16 1.0s
  alignas(64) float c[kAmxRows * kAmxRows];
  amx_begin();
  tile_zero<0>(), tile_zero<1>(), tile_zero<2>(), tile_zero<3>();
  tile_load<4>(ones, 64), tile_load<5>(ones, 64), tile_load<6>(ones, 64), tile_load<7>(ones, 64);
  for (int64_t r = 0; r < rounds; ++r) {
    tile_dot<0, 4, 6>(), tile_dot<1, 4, 7>(), tile_dot<2, 5, 6>(), tile_dot<3, 5, 7>();
  }
  tile_store<0>(c, 64);
  amx_end();
  return c[0] * seed;
}
#endif

}  // namespace

double peak_gflops(bool bf16_dot, double seconds) {
  const Isa isa = kernel_isa();
  if (bf16_dot && !has_bf16_dot(isa)) return 0.0;
  const bool tiles = bf16_dot && isa == Isa::Amx;
  // FLOPs per round: chains x lanes x 2 (a dot product counts its two multiplies and adds);
  // four tile products of 16 x 16 x 32
  const double round_flops = tiles      ? 4 * 16 * 16 * 32 * 2
                             : bf16_dot ? 24 * 32 * 2
                             : isa == Isa::Narrow ? 12 * 8 * 2
                                                  : 24 * 16 * 2;
  auto run = [&](int64_t rounds) {
    const int64_t threads = num_threads();
    std::vector<double> sink(threads);
    const auto start = std::chrono::steady_clock::now();
    parallel_for(threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float seed = 1e-3f * static_cast<float>(t + 1);
        switch (bf16_dot ? isa : std::min(isa, Isa::Wide)) {
#if GNOMON_HAS_WIDE_KERNELS
          case Isa::Amx: sink[t] = tile_rounds_amx(rounds, seed); break;
          case Isa::WideBf16: sink[t] = dot_rounds_bf16(rounds, seed); break;
          case Isa::Wide: sink[t] = fma_rounds_wide(rounds, seed); break;
#endif
          default: sink[t] = fma_rounds_narrow(rounds, seed); break;
        }
      }
    });
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    volatile double keep = sink[0];
    (void)keep;
    return std::pair{elapsed, static_cast<double>(threads) * rounds * round_flops};
  };
  // The best of several short runs: a run that the OS preempts only ever reads slower.
  int64_t rounds = 1 << 16;
  while (run(rounds).first < 2e-3 && rounds < (int64_t{1} << 34)) rounds *= 2;
  double best = 0.0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(seconds, 0.0));
  int runs = 0;
  do {
    const auto [elapsed, flops] = run(rounds);
    best = std::max(best, flops / elapsed / 1e9);
  } while (++runs < 5 || std::chrono::steady_clock::now() < deadline);
  return best;
}

}  // namespace gnomon::cpu
