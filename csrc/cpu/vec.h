#pragma once
// The CPU kernels' one vector layer.
//
// Row helpers (load_floats, dot, ...) are compiled for AVX-512, AVX2 and the baseline and picked
// at load time (core/simd.h). Hot loops use Vec<L>: L-lane vectors of GCC/Clang vector
// extensions that every target lowers to its own registers (one zmm for Wide, one ymm or two xmm
// for Narrow, NEON pairs on arm64). A kernel is written once over V and instantiated twice: Wide
// in a function built for x86-64-v4, Narrow in a GNOMON_SIMD_CLONES function; kernel_isa() says
// which one runs. Intrinsics appear only where the vector extensions have no spelling (the bf16
// dot product). Vectors are passed between always-inline helpers only, never across a call ABI.
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "core/scalar_math.h"
#include "core/simd.h"
#include "core/tensor.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vectors in the narrow clones: see above
#endif

#define GNOMON_INLINE inline __attribute__((always_inline))

#if GNOMON_HAS_SIMD_CLONES
#define GNOMON_TARGET_WIDE __attribute__((target("arch=x86-64-v4")))
#define GNOMON_TARGET_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16")))
#define GNOMON_TARGET_AMX __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16")))
#define GNOMON_HAS_WIDE_KERNELS 1
#else
#define GNOMON_HAS_WIDE_KERNELS 0
#endif

namespace gnomon::cpu {

// dst[i] = float(src[i]) for float32, bfloat16 or float16 `src`.
void load_floats(const void* src, DType dtype, float* dst, int64_t n);
// dst[i] = src[i] rounded to nearest even in `dtype`.
void store_floats(const float* src, DType dtype, void* dst, int64_t n);

float dot(const float* a, const float* b, int64_t n);
float sum_squares(const float* x, int64_t n);
void axpy(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
void scale(float alpha, float* x, int64_t n);                 // x *= alpha
void scale_by(float alpha, const float* w, float* x, int64_t n);  // x = x * alpha * w

// The kernel family a call runs: Narrow (8 lanes: AVX2 or the baseline, by load-time clone),
// Wide (16 lanes, AVX-512), Wide with the AVX512-BF16 dot product for bfloat16 data, or that
// with AMX-BF16 tiles for the bf16 GEMMs (Intel, from Sapphire Rapids). The CPU's best, capped
// by GNOMON_CPU_KERNELS=narrow|wide|bf16 (read on every call, for tests and benchmarks of the
// other paths); any other value raises a ValueError naming the variable.
enum class Isa { Narrow, Wide, WideBf16, Amx };
Isa kernel_isa();
const char* isa_name(Isa isa);
inline bool has_bf16_dot(Isa isa) { return isa == Isa::WideBf16 || isa == Isa::Amx; }
// The clone of the row helpers (load_floats, dot, ...: rms_norm, rotary) picked at load time.
const char* row_helpers_isa();
bool cpu_has_wide();
bool cpu_has_bf16_dot();
// AMX-BF16 tiles that this process may use: the CPU has them and Linux granted the permission
// (arch_prctl ARCH_REQ_XCOMP_PERM, asked once).
bool cpu_has_amx();

// The vector units' peak GFLOP/s on the kernel family above, at num_threads() threads: FMAs on
// registers, or bf16 dot products (AMX tile products on the Amx family; 0 where the family has
// none); the best of runs over `seconds` (at least five).
double peak_gflops(bool bf16_dot, double seconds);

// dst[c][r] = src[r][c] for r < n and c < cols, 32-bit words. On wide kernels src rows are read
// to cols rounded up to 16 and dst rows written to n rounded up to 16 (zeros past n).
void transpose_words(Isa isa, const void* src, int64_t n, int64_t cols, int64_t src_stride,
                     void* dst, int64_t dst_stride);

// Storage on 64-byte boundaries for the buffers the GEMMs stream: an AMX tile row (and a
// 64-byte vector) that straddles two cache lines loads at a fraction of the rate (tile loads
// measured about 4x slower from 16-byte aligned rows). AlignedVector zero-fills like
// std::vector; make_aligned leaves the storage uninitialised.
inline constexpr std::align_val_t kCacheLine{64};

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kCacheLine)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kCacheLine); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

struct CacheLineDelete {
  void operator()(void* p) const { ::operator delete[](p, kCacheLine); }
};
template <typename T>
using AlignedArray = std::unique_ptr<T[], CacheLineDelete>;
template <typename T>
AlignedArray<T> make_aligned(size_t n) {
  static_assert(std::is_trivial_v<T>);
  return AlignedArray<T>(static_cast<T*>(::operator new[](n * sizeof(T), kCacheLine)));
}

template <int Lanes>
struct Vec {
  static constexpr int L = Lanes;
  typedef float F __attribute__((vector_size(4 * Lanes)));
  typedef uint32_t U __attribute__((vector_size(4 * Lanes)));
  typedef int32_t I __attribute__((vector_size(4 * Lanes)));
  typedef uint16_t H __attribute__((vector_size(2 * Lanes)));
  typedef uint8_t B __attribute__((vector_size(Lanes)));
};
using Narrow = Vec<8>;
using Wide = Vec<16>;

template <typename T>
GNOMON_INLINE T load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
GNOMON_INLINE void store(void* p, const T& v) {
  std::memcpy(p, &v, sizeof(v));
}

template <typename To, typename From>
GNOMON_INLINE To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

// L consecutive 8- or 16-bit values at p, zero-extended to 32-bit lanes. GCC 12 lowers
// __builtin_convertvector of a loaded byte vector to one scalar insert per lane inside the
// kernels' loops, so Wide vectors spell out vpmovzxbd / vpmovzxwd. As inline assembly, since an
// intrinsic could not be inlined into these target-neutral templates; Wide instances only ever
// run inlined into functions built for AVX-512.
template <typename V, typename T>
GNOMON_INLINE typename V::U widen(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2);
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (V::L == 16) {
    typename V::U out;
    const auto& in = *reinterpret_cast<const T(*)[16]>(p);
    if constexpr (sizeof(T) == 1) {
      asm("vpmovzxbd %1, %0" : "=v"(out) : "m"(in));
    } else {
      asm("vpmovzxwd %1, %0" : "=v"(out) : "m"(in));
    }
    return out;
  }
#endif
  if constexpr (sizeof(T) == 1) {  // through 16 bits, which GCC lowers to two zero-extensions
    return __builtin_convertvector(
        __builtin_convertvector(load<typename V::B>(p), typename V::H), typename V::U);
  } else {
    return __builtin_convertvector(load<typename V::H>(p), typename V::U);
  }
}

// GCC's vector conditional becomes a mask blend (AVX-512) or a blendv (AVX2).
template <typename F, typename I>
GNOMON_INLINE F select(const I& mask, const F& a, const F& b) {
#if defined(__GNUC__) && !defined(__clang__)
  return mask ? a : b;
#else
  return bit_cast<F>((bit_cast<I>(a) & mask) | (bit_cast<I>(b) & ~mask));
#endif
}

// The sum (or the largest) of the lanes: halves combined until two lanes are left, extracts and
// adds (or maxes), not a chain of scalar steps.
template <bool kMax, typename F>
GNOMON_INLINE float fold_lanes(const F& v) {
  constexpr int L = sizeof(F) / 4;
  if constexpr (L == 2) {
    return kMax ? (v[1] > v[0] ? v[1] : v[0]) : v[0] + v[1];
  } else {
    using Half = typename Vec<L / 2>::F;
    Half lo, hi;
    std::memcpy(&lo, &v, sizeof(lo));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
    if constexpr (kMax) {
      return fold_lanes<true>(select(hi > lo, hi, lo));
    } else {
      return fold_lanes<false>(lo + hi);
    }
  }
}

template <typename F>
GNOMON_INLINE float reduce_add(const F& v) {
  return fold_lanes<false>(v);
}

template <typename F>
GNOMON_INLINE float reduce_max(const F& v) {
  return fold_lanes<true>(v);
}

template <typename F>
GNOMON_INLINE F max(const F& a, const F& b) {
  return select(a > b, a, b);
}

// table[index mod L] per lane: one permute on AVX2, AVX-512 and NEON.
template <typename V>
GNOMON_INLINE typename V::F lookup(const typename V::F& table, const typename V::U& index) {
#if defined(__GNUC__) && !defined(__clang__)
  return __builtin_shuffle(table, bit_cast<typename V::I>(index));
#else
  typename V::F out;
  for (int i = 0; i < V::L; ++i) out[i] = table[index[i] % V::L];
  return out;
#endif
}

// e^x lane by lane for x <= 0, no calls or branches: Cody-Waite reduction by ln 2 and the Cephes
// expf polynomial (within 2 ulp of expf). Lanes below -87, -inf included, give 0; NaN stays NaN.
// 2^n comes from the bits of the rounding sum, so no float-to-int conversion is involved.
template <typename V>
GNOMON_INLINE typename V::F exp_nonpositive(const typename V::F& x) {
  using F = typename V::F;
  using I = typename V::I;
  const I underflow = x < -87.0f;
  const F xc = select(underflow, F{} - 87.0f, x);
  const F shifted = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: rounds to int
  const F n = shifted - 12582912.0f;
  const F r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const F two_n = bit_cast<F>((bit_cast<I>(shifted) - 0x4b400000 + 127) << 23);  // 2^n
  return select(underflow, F{}, p * two_n);
}

// 2^x lane by lane for x < 128 (a softmax's exponents, which may sit a little above the max they
// are taken from), no calls or branches: x = n + f with n = round(x) and |f| <= 1/2, a degree-5
// minimax polynomial for 2^f (within 1.7e-7 relative, and exactly 1 at 0) and 2^n from the bits
// of the rounding sum. Lanes below -127, -inf included, give 0; NaN stays NaN. Cheaper than
// exp_nonpositive by its range reduction, for the softmaxes that fold log2(e) into their scale.
// kForBf16: a degree-3 polynomial (within 1.1e-4 relative, still exactly 1 at 0), for values
// that are rounded to bfloat16 next, whose half ulp is 2^-9.
template <typename V, bool kForBf16 = false>
GNOMON_INLINE typename V::F exp2_below_128(const typename V::F& x) {
  using F = typename V::F;
  const F floor = F{} - 127.0f;
  F xc;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if constexpr (V::L == 16) {
    // one vmaxps (GCC makes the select a compare and a blend); a NaN lane returns its second
    // source, x
    asm("vmaxps %2, %1, %0" : "=v"(xc) : "v"(floor), "v"(x));
  } else
#endif
  {
    xc = select(x < -127.0f, floor, x);
  }
  const F shifted = xc + 12583039.0f;  // 1.5 * 2^23 + 127: its low bits hold round(x) + 127
  const F f = xc - (shifted - 12583039.0f);
  F p;
  if constexpr (kForBf16) {
    p = f * 5.500858e-2f + 2.4221037e-1f;
    p = p * f + 6.932829e-1f;
  } else {
    p = f * 1.3267117e-3f + 9.6715977e-3f;
    p = p * f + 5.5507265e-2f;
    p = p * f + 2.4022241e-1f;
    p = p * f + 6.9314700e-1f;
  }
  p = p * f + 1.0f;
  return p * bit_cast<F>(bit_cast<typename V::U>(shifted) << 23);  // exponent field n + 127
}

// float lanes to bfloat16 bits (round to nearest even) in the low 16 bits of each lane; for
// finite values, which is all the kernels round this way.
template <typename V>
GNOMON_INLINE typename V::U bf16_bits(const typename V::F& x) {
  const typename V::U bits = bit_cast<typename V::U>(x);
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// Two float vectors rounded to bfloat16 (nearest even) and interleaved as 32-bit pairs, lane i
// = bits(even[i]) | bits(odd[i]) << 16: the layout of a bf16 dot product's pairs. Wide vectors
// take vcvtne2ps2bf16 and one word permute (so only AVX512-BF16 kernels may call it with Wide;
// the instruction also reads subnormal inputs as zero).
template <typename V>
GNOMON_INLINE typename V::U bf16_pairs(const typename V::F& even, const typename V::F& odd) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if constexpr (V::L == 16) {
    typedef uint16_t Words __attribute__((vector_size(64)));
    Words packed;  // even's 16 words, then odd's
    asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(packed) : "v"(odd), "v"(even));
    const Words interleave = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                              8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return bit_cast<typename V::U>(__builtin_shuffle(packed, interleave));
  }
#endif
  return bf16_bits<V>(even) | (bf16_bits<V>(odd) << 16);
}

// float16 bits (in the low 16 bits of each lane) to float, exactly: subnormals, infinities and
// NaNs included. The exponent and mantissa move into float position and a multiply by 2^112
// rebiases them (exact, also for subnormal halves); exponent 31 becomes a float infinity or NaN.
template <typename V>
GNOMON_INLINE typename V::F half_to_float(const typename V::U& half) {
  using U = typename V::U;
  using F = typename V::F;
  const U magnitude = half & 0x7fffu;
  U bits = bit_cast<U>(bit_cast<F>(magnitude << 13) * 0x1p112f);
  bits = select(bit_cast<typename V::I>(magnitude >= 0x7c00u), (magnitude << 13) | 0x7f800000u, bits);
  return bit_cast<F>(bits | ((half & 0x8000u) << 16));
}

// ---- AMX tiles ----
//
// Every kernel uses one tile configuration: eight tiles of 16 rows x 64 bytes, so a tile holds
// 16 x 16 floats (C, tiles 0-3), 16 rows of 16 bf16 pairs (A, tiles 4-5) or 16 pairs x 16 lanes
// of bf16 pairs (B, tiles 6-7; the VNNI layout, which a [pairs][lanes] matrix of words already
// is). A kernel loads it on entry and releases the tiles on return, so no state is left behind
// for other code on the thread (oneDNN uses tiles too).
#if GNOMON_HAS_WIDE_KERNELS
struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
inline constexpr int kAmxRows = 16;   // rows of a tile
inline constexpr int kAmxPairs = 16;  // bf16 pairs along k per tile row

GNOMON_TARGET_AMX inline void amx_begin() {
  static const AmxConfig config;
  _tile_loadconfig(&config);
}
GNOMON_TARGET_AMX inline void amx_end() { _tile_release(); }

// The tile intrinsics take their tile numbers as literal tokens; these take them as templates.
// They are inline assembly in GCC's headers, so these need no target attribute (lambdas,
// which do not inherit one, call them), and that assembly names no memory: the compiler
// barriers keep ordinary stores before a tile load of their bytes and ordinary loads after a
// tile store.
#define GNOMON_TILE_CASES(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
template <int T>
GNOMON_INLINE void tile_load(const void* p, int64_t stride) {
  asm volatile("" ::: "memory");
#define GNOMON_TILE(t) if constexpr (T == t) _tile_loadd(t, p, stride);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
}
template <int T>
GNOMON_INLINE void tile_store(void* p, int64_t stride) {
#define GNOMON_TILE(t) if constexpr (T == t) _tile_stored(t, p, stride);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
  asm volatile("" ::: "memory");
}
template <int T>
GNOMON_INLINE void tile_zero() {
#define GNOMON_TILE(t) if constexpr (T == t) _tile_zero(t);
  GNOMON_TILE_CASES(GNOMON_TILE)
#undef GNOMON_TILE
}
#undef GNOMON_TILE_CASES
template <int C, int A, int B>
GNOMON_INLINE void tile_dot() {
  static_assert(C < 4 && (A == 4 || A == 5) && (B == 6 || B == 7));
#define GNOMON_TILE(c)                                       \
  if constexpr (C == c) {                                    \
    if constexpr (A == 4 && B == 6) _tile_dpbf16ps(c, 4, 6); \
    if constexpr (A == 4 && B == 7) _tile_dpbf16ps(c, 4, 7); \
    if constexpr (A == 5 && B == 6) _tile_dpbf16ps(c, 5, 6); \
    if constexpr (A == 5 && B == 7) _tile_dpbf16ps(c, 5, 7); \
  }
  GNOMON_TILE(0) GNOMON_TILE(1) GNOMON_TILE(2) GNOMON_TILE(3)
#undef GNOMON_TILE
}
#endif

#if GNOMON_HAS_WIDE_KERNELS
// The 16 x 16 matrix of words in m, transposed: four butterfly stages, each swapping bit s of
// the row index with bit s of the column index (one two-source permute per row).
GNOMON_INLINE void transpose16(Wide::U* m) {
  using U = Wide::U;
  for (int b = 8; b > 0; b /= 2) {
    U low, high;
    for (int c = 0; c < 16; ++c) {
      low[c] = (c & b) ? 16 + c - b : c;
      high[c] = (c & b) ? 16 + c : c + b;
    }
    for (int i = 0; i < 16; ++i) {
      if (i & b) continue;
      const U a = m[i], c = m[i + b];
      m[i] = __builtin_shuffle(a, c, low);
      m[i + b] = __builtin_shuffle(a, c, high);
    }
  }
}
#endif

// ---- MXFP4 element codes (OCP MX E2M1) ----

// The first L values of the E2M1 code table, lane-repeated: 16 codes for wide vectors, the 8
// magnitudes (the sign is bit 3) for narrow ones.
template <typename V>
GNOMON_INLINE typename V::F e2m1_table() {
  // Literal values, so that the table is a constant vector rather than built per use.
  constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  typename V::F table;
  for (int i = 0; i < V::L; ++i) table[i] = kValues[i % 16];
  return table;
}

// E2M1 codes in the low nibble of (word >> shift) to floats; the lookup takes indices mod L, so
// the upper bits need no mask. Wide vectors look up all 16 codes; narrow ones look up the
// magnitude (bits 0-2) and move bit 3 of the code to the float's sign.
template <typename V>
GNOMON_INLINE typename V::F decode_nibbles(const typename V::F& table, const typename V::U& words,
                                           int shift) {
  using U = typename V::U;
  using F = typename V::F;
  const U codes = words >> shift;
  if constexpr (V::L >= 16) {
    return lookup<V>(table, codes);
  } else {
    const U magnitude = bit_cast<U>(lookup<V>(table, codes));
    return bit_cast<F>(magnitude | ((codes & 8u) << 28));
  }
}

}  // namespace gnomon::cpu
