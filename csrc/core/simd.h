#pragma once
// GNOMON_SIMD_CLONES compiles a function for AVX-512 (x86-64-v4), AVX2+FMA (x86-64-v3) and the
// baseline, and picks one at load time from what the CPU reports (GCC function multiversioning).
// Put it on a whole hot loop, not on a tiny helper: clones are not inlined into their callers.
// Elsewhere (arm64, clang, device code) it expands to nothing and the plain build is used.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && defined(__linux__)
#define GNOMON_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define GNOMON_HAS_SIMD_CLONES 1
#else
#define GNOMON_SIMD_CLONES
#define GNOMON_HAS_SIMD_CLONES 0
#endif

// GNOMON_HAS_X86_INTRINSICS: <immintrin.h> is included and the kernels may use intrinsics inside
// functions carrying a target attribute, behind a run-time CPU check.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__)
#define GNOMON_HAS_X86_INTRINSICS 1
// GCC 12's AVX-512 headers build "undefined" vectors as `__m512 __Y = __Y;`, which
// -Wmaybe-uninitialized reports wherever the intrinsics are inlined.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
#define GNOMON_HAS_X86_INTRINSICS 0
#endif
