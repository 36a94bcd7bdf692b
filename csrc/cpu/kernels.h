#pragma once
// The CPU kernels, one family per file. Each receives arguments its entry in ops.cpp has already
// checked in full, with the same signature as that entry.
#include "ops.h"

namespace gnomon::cpu {

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

}  // namespace gnomon::cpu
