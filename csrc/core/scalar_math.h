#pragma once
// The scalar math that CPU and GPU kernels share: bf16/fp16 conversion, the MXFP4 element and
// scale codes, the online-softmax update, top-k selection and the MoE activations. Every function
// is inline and host/device, so hip/*.hip includes this header unchanged.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GNOMON_HD __host__ __device__ __forceinline__
#else
#define GNOMON_HD inline
#endif

namespace gnomon::math {

GNOMON_HD float bits_to_float(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

GNOMON_HD uint32_t float_to_bits(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// ---- bf16 and fp16, stored as uint16 -----------------------------------------------------------

GNOMON_HD float bf16_to_float(uint16_t v) { return bits_to_float(static_cast<uint32_t>(v) << 16); }

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
GNOMON_HD uint16_t float_to_bf16(float f) {
  const uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

GNOMON_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
  return sign ? -magnitude : magnitude;
}

// Round to nearest even, overflow to infinity, NaN stays NaN.
GNOMON_HD uint16_t float_to_fp16(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (abs_bits < 0x38800000u) {                         // below 2^-14: fp16 subnormal or zero
    const float scaled = bits_to_float(abs_bits) * 16777216.0f;  // exact: units of 2^-24
    const float rounded = std::nearbyint(scaled);                // current mode: nearest even
    return sign | static_cast<uint16_t>(rounded);
  }
  const uint32_t rounding = 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | static_cast<uint16_t>(((abs_bits + rounding) >> 13) - (112u << 10));
}

// ---- MXFP4 (OCP MX v1.0): E2M1 elements, E8M0 scales -------------------------------------------

constexpr uint8_t kE8M0NaN = 0xff;
constexpr int kMxfp4BlockSize = 32;

enum class ScaleRule : int32_t { Floor = 0, Ceil = 1 };

// Codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
GNOMON_HD float e2m1_to_float(uint8_t code) {
  const uint32_t exponent = (code >> 1) & 3u;
  const float mantissa = static_cast<float>(code & 1u);
  const float magnitude =
      exponent == 0 ? 0.5f * mantissa : (1.0f + 0.5f * mantissa) * static_cast<float>(1u << (exponent - 1));
  return (code & 8u) ? -magnitude : magnitude;
}

// Nearest-even rounding onto the E2M1 grid, saturating at +-6. Ties go to the even code:
// 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. The code counts the rounding
// thresholds at or above |x| (<= where the tie goes down, < where it goes up), branch-free so that
// loops over it vectorise; everything above 5, NaN included, lands on code 7 (6): saturation.
GNOMON_HD uint8_t float_to_e2m1(float x) {
  const float a = std::fabs(x);
  const int below = (a <= 0.25f) + (a < 0.75f) + (a <= 1.25f) + (a < 1.75f) + (a <= 2.5f) +
                    (a < 3.5f) + (a <= 5.0f);
  return static_cast<uint8_t>((std::signbit(x) ? 8 : 0) | (7 - below));
}

// 2^(byte - 127); 0xFF is NaN, 0x00 is 2^-127 (a float subnormal, exact).
GNOMON_HD float e8m0_to_float(uint8_t byte) {
  if (byte == kE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  if (byte == 0) return bits_to_float(0x00400000u);
  return bits_to_float(static_cast<uint32_t>(byte) << 23);
}

// The shared exponent of a block whose largest magnitude is `amax` (finite, > 0), as a biased
// E8M0 byte. "floor" is the spec rule 2^(floor(log2 amax) - 2); "ceil" the smallest power of two
// with amax / scale <= 6. Exponents are clamped to E8M0's range [-127, 127].
GNOMON_HD uint8_t mxfp4_scale_byte(float amax, ScaleRule rule) {
  int e2;
  std::frexp(amax, &e2);  // amax = m * 2^e2, m in [0.5, 1): floor(log2 amax) = e2 - 1
  int exponent = e2 - 1 - 2;
  if (rule == ScaleRule::Ceil && std::ldexp(amax, -exponent) > 6.0f) exponent += 1;
  exponent = exponent < -127 ? -127 : (exponent > 127 ? 127 : exponent);
  return static_cast<uint8_t>(exponent + 127);
}

// Element 2i sits in the low nibble of byte i, element 2i+1 in the high nibble.
GNOMON_HD float mxfp4_low(uint8_t byte) { return e2m1_to_float(byte & 0x0f); }
GNOMON_HD float mxfp4_high(uint8_t byte) { return e2m1_to_float(byte >> 4); }

// ---- online softmax ------------------------------------------------------------------------------

// A running max and denominator. add() returns how much to rescale the value accumulator by and
// writes the new element's weight to `p`; fully masked rows stay at max = -inf, sum = 0.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;

  GNOMON_HD float add(float logit, float& p) {
    const float new_max = logit > max ? logit : max;
    if (new_max == -std::numeric_limits<float>::infinity()) {
      p = 0.0f;
      return 1.0f;
    }
    const float rescale = std::exp(max - new_max);
    p = std::exp(logit - new_max);
    sum = sum * rescale + p;
    max = new_max;
    return rescale;
  }

  // Folds in another partial softmax; self_scale / other_scale rescale the two accumulators.
  GNOMON_HD void merge(const OnlineSoftmax& other, float& self_scale, float& other_scale) {
    const float new_max = other.max > max ? other.max : max;
    if (new_max == -std::numeric_limits<float>::infinity()) {
      self_scale = other_scale = 0.0f;
      return;
    }
    self_scale = std::exp(max - new_max);
    other_scale = std::exp(other.max - new_max);
    sum = sum * self_scale + other.sum * other_scale;
    max = new_max;
  }
};

// ---- routing and activations ---------------------------------------------------------------------

// Orders like torch.topk: NaN above every number, so a NaN logit is selected and poisons its
// token's weights instead of silently displacing the ranking.
GNOMON_HD bool topk_before(float a, float b) { return a > b || (a != a && b == b); }

// Inserts (value, id) into the descending top-k list vals/ids of current length `count` (< k or
// full). Ties keep the lower id first, so selection is deterministic.
GNOMON_HD void topk_insert(float value, int32_t id, float* vals, int32_t* ids, int& count, int k) {
  if (count == k && !topk_before(value, vals[k - 1])) return;
  int pos = count < k ? count++ : k - 1;
  while (pos > 0 && topk_before(value, vals[pos - 1])) {
    vals[pos] = vals[pos - 1];
    ids[pos] = ids[pos - 1];
    --pos;
  }
  vals[pos] = value;
  ids[pos] = id;
}

GNOMON_HD float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// SwiGLU as Llama and Mixtral use it: silu(gate) * up.
GNOMON_HD float silu_and_mul(float gate, float up) { return gate * sigmoid(gate) * up; }

// gpt-oss: gate clamped at 7, up clamped to [-7, 7], (up + 1) * gate * sigmoid(1.702 * gate).
GNOMON_HD float swiglu_oai(float gate, float up) {
  constexpr float kLimit = 7.0f;
  constexpr float kAlpha = 1.702f;
  gate = gate > kLimit ? kLimit : gate;
  up = up > kLimit ? kLimit : (up < -kLimit ? -kLimit : up);
  return (up + 1.0f) * gate * sigmoid(kAlpha * gate);
}

}  // namespace gnomon::math
