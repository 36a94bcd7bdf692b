#pragma once
#include <string>
#include <vector>

namespace gnomon {

struct BuildInfo {
  std::string version;
  std::string compiler;
  std::string build_type;
  std::string cxx_flags;
  std::vector<std::string> sanitizers;
  std::string simd_compiled;              // the instruction set the binary's baseline assumes
  std::vector<std::string> simd_cpu;      // SIMD extensions this CPU reports at run time
  std::vector<std::string> gpu_backends;  // "hip", "cuda"; empty on a CPU-only build
  std::string gpu_architectures;          // "80;90", "gfx90a"; empty on a CPU-only build
};

BuildInfo build_info();

}  // namespace gnomon
