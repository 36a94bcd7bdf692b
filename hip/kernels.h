#pragma once
// The GPU launchers: one per op, the same arguments as the CPU kernels (cpu/kernels.h). Plain
// C++ so csrc/ops.cpp can call them; defined in hip/*.hip, compiled by nvcc or hipcc. Each
// launches on the stream its lead tensor's view carries (TensorView::stream) and checks the
// launch. The host-side checks in ops.cpp that read index contents (slot ids, block ids, expert
// ids, positions) are CPU-only; the kernels skip or clamp what those checks would have refused
// rather than read out of bounds.
#include "core/tensor.h"
#include "ops.h"

namespace gnomon::gpu {

// "cuda" or "hip", and the architectures compiled in ("80;90", "gfx90a").
const char* backend();
const char* architectures();

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

}  // namespace gnomon::gpu
