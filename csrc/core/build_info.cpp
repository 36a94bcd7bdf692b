#include "core/build_info.h"

namespace gnomon {
namespace {

std::string compiler_name() {
#if defined(__clang__)
  return "Clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#elif defined(_MSC_VER)
  return "MSVC " + std::to_string(_MSC_VER);
#else
  return "unknown";
#endif
}

std::string simd_compiled() {
#if defined(__AVX512F__)
  return "avx512f";
#elif defined(__AVX2__)
  return "avx2";
#elif defined(__SSE4_2__)
  return "sse4.2";
#elif defined(__x86_64__)
  return "sse2 (x86-64 baseline)";
#elif defined(__ARM_NEON)
  return "neon";
#else
  return "none";
#endif
}

std::vector<std::string> simd_cpu() {
  std::vector<std::string> found;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) found.emplace_back("sse4.2");
  if (__builtin_cpu_supports("avx2")) found.emplace_back("avx2");
  if (__builtin_cpu_supports("fma")) found.emplace_back("fma");
  if (__builtin_cpu_supports("f16c")) found.emplace_back("f16c");
  if (__builtin_cpu_supports("avx512f")) found.emplace_back("avx512f");
  if (__builtin_cpu_supports("avx512bw")) found.emplace_back("avx512bw");
  if (__builtin_cpu_supports("avx512vl")) found.emplace_back("avx512vl");
#elif defined(__ARM_NEON)
  found.emplace_back("neon");
#endif
  return found;
}

std::vector<std::string> sanitizers() {
  std::vector<std::string> on;
#if defined(GNOMON_ASAN)
  on.emplace_back("address");
#endif
#if defined(GNOMON_UBSAN)
  on.emplace_back("undefined");
#endif
  return on;
}

std::vector<std::string> gpu_backends() {
  std::vector<std::string> on;
#if defined(GNOMON_WITH_HIP)
  on.emplace_back("hip");
#endif
#if defined(GNOMON_WITH_CUDA)
  on.emplace_back("cuda");
#endif
  return on;
}

}  // namespace

#if !defined(GNOMON_GPU_ARCHS)
#define GNOMON_GPU_ARCHS ""
#endif

BuildInfo build_info() {
  return BuildInfo{GNOMON_VERSION, compiler_name(), GNOMON_BUILD_TYPE, GNOMON_CXX_FLAGS,
                   sanitizers(),   simd_compiled(),  simd_cpu(),       gpu_backends(),
                   GNOMON_GPU_ARCHS};
}

}  // namespace gnomon
