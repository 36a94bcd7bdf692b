#pragma once
// One entry per op. Each checks every invariant it relies on — dtypes, shapes, devices,
// contiguity and, for CPU tensors, the index values it will dereference — then dispatches on the
// device. The CPU kernels (cpu/kernels.h) and the GPU launchers (hip/kernels.h) take exactly the
// same arguments; the GPU ones run on the stream the lead tensor's view carries.
#include <cstdint>
#include <string>

#include "core/scalar_math.h"
#include "core/tensor.h"

namespace gnomon {

enum class RoutingMode : int32_t { SoftmaxTopk = 0, TopkSoftmax = 1 };
enum class Activation : int32_t { Silu = 0, SwigluOai = 1 };
enum class GateUpLayout : int32_t { Concat = 0, Interleaved = 1 };
using math::ScaleRule;

// Names as the Python API spells them; unknown names raise ValueError naming `arg`.
RoutingMode parse_routing_mode(const std::string& name, const char* arg);
Activation parse_activation(const std::string& name, const char* arg);
GateUpLayout parse_gate_up_layout(const std::string& name, const char* arg);
ScaleRule parse_scale_rule(const std::string& name, const char* arg);

constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kMaxTopK = 64;

// Optional tensors are passed as pointers; nullptr means absent. sliding_window 0 means none.
void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping);
void paged_attention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_tables,
                     const TensorView& seq_lens, const TensorView& query_start_loc, double scale,
                     int64_t sliding_window, const TensorView* sinks);
void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
              const TensorView* residual);
void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView& key,
                      const TensorView& cos_sin_cache, bool is_neox);
void topk_routing(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& router_logits, int64_t top_k, RoutingMode mode,
                  bool renormalize);
void fused_moe(const TensorView& out, const TensorView& hidden, const TensorView& w13,
               const TensorView& w2, const TensorView& topk_weights, const TensorView& topk_ids,
               Activation activation, GateUpLayout gate_up_layout, const TensorView* w13_bias,
               const TensorView* w2_bias, const TensorView* w13_scales,
               const TensorView* w2_scales);
void mxfp4_quantize(const TensorView& packed, const TensorView& scales, const TensorView& x,
                    ScaleRule scale_rule);
void mxfp4_dequantize(const TensorView& out, const TensorView& packed, const TensorView& scales);
void mxfp4_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                const TensorView& w_scales, const TensorView* bias);

}  // namespace gnomon
