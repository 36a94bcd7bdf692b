"""The block-scaled weight formats' constants, defined once (no imports: every layer may use
them). Bits per element count a block's codes and its scale, spread over the block."""

# MXFP4: OCP Microscaling Formats (MX) Specification v1.0, E2M1 elements with an E8M0 scale.
MXFP4_BLOCK = 32  # elements that share one E8M0 scale (OCP MX v1.0, MXFP4: block size k = 32)
E8M0_BIAS = 127  # an E8M0 scale is 2^(byte - 127), 0xFF = NaN (OCP MX v1.0, the E8M0 type)
MXFP4_BITS = 4 + 8 / MXFP4_BLOCK  # 4.25: a 4-bit code each + one 8-bit scale per 32 (MX v1.0)

# NVFP4: NVIDIA's description ("Introducing NVFP4 for Efficient and Accurate Low-Precision
# Inference", NVIDIA technical blog, 2025): E2M1 elements with an FP8 E4M3 scale per block, and
# one FP32 scale per tensor (not counted per element).
NVFP4_BLOCK = 16  # elements that share one FP8 E4M3 scale (NVIDIA NVFP4: 16-element blocks)
NVFP4_BITS = 4 + 8 / NVFP4_BLOCK  # 4.5: a 4-bit code each + one 8-bit scale per 16 (NVIDIA)
