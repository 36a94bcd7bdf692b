#include "ops.h"

#include <cmath>

#include "core/errors.h"
#include "cpu/kernels.h"
#if defined(GNOMON_HAS_GPU)
#include "kernels.h"  // hip/kernels.h: the GPU launchers

// One op call on the lead tensor's device; `call` is the op with its arguments.
#define GNOMON_RUN(on_gpu, call) ((on_gpu) ? gpu::call : cpu::call)
#else
#define GNOMON_RUN(on_gpu, call) ((void)(on_gpu), cpu::call)
#endif

namespace gnomon {
namespace {

constexpr std::initializer_list<DType> kFloating = {DType::Float32, DType::BFloat16,
                                                     DType::Float16};

#if defined(GNOMON_WITH_CUDA)
constexpr DeviceType kGpuDevice = DeviceType::CUDA;
#elif defined(GNOMON_WITH_HIP)
constexpr DeviceType kGpuDevice = DeviceType::HIP;
#endif

// Every tensor of one call must sit on `lead`'s device, a CPU or the build's GPU backend.
// Returns whether the call runs on the GPU. Checks that read index tensors' contents on the
// host run only for CPU calls (see hip/kernels.h for what the GPU kernels do instead).
bool check_devices(const char* lead_arg, const TensorView& lead,
                   std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  for (const auto& [arg, view] : others) {
    if (view != nullptr) check_same_device(*view, arg, lead, lead_arg);
  }
  if (lead.device == DeviceType::CPU) return false;
#if defined(GNOMON_HAS_GPU)
  if (lead.device == kGpuDevice) return true;
#endif
  raise<ValueError>(lead_arg, ": this build of gnomon has no kernels for ",
                    device_name(lead.device),
                    " tensors; see `gnomon info` for the backends built");
}

void check_same_dtype(const TensorView& t, const char* arg, const TensorView& reference,
                      const char* reference_arg) {
  if (t.dtype != reference.dtype) {
    raise<TypeError>(arg, ": expected dtype ", dtype_name(reference.dtype), " like ",
                     reference_arg, ", got ", dtype_name(t.dtype));
  }
}

int64_t int_at(const TensorView& t, int64_t i) {
  return t.dtype == DType::Int64 ? t.ptr<const int64_t>()[i] : t.ptr<const int32_t>()[i];
}

void check_finite(double value, const char* arg) {
  if (!std::isfinite(value)) raise<ValueError>(arg, ": expected a finite number, got ", value);
}

}  // namespace

RoutingMode parse_routing_mode(const std::string& name, const char* arg) {
  if (name == "softmax_topk") return RoutingMode::SoftmaxTopk;
  if (name == "topk_softmax") return RoutingMode::TopkSoftmax;
  raise<ValueError>(arg, ": expected 'softmax_topk' or 'topk_softmax', got '", name, "'");
}

Activation parse_activation(const std::string& name, const char* arg) {
  if (name == "silu") return Activation::Silu;
  if (name == "swiglu_oai") return Activation::SwigluOai;
  raise<ValueError>(arg, ": expected 'silu' or 'swiglu_oai', got '", name, "'");
}

GateUpLayout parse_gate_up_layout(const std::string& name, const char* arg) {
  if (name == "concat") return GateUpLayout::Concat;
  if (name == "interleaved") return GateUpLayout::Interleaved;
  raise<ValueError>(arg, ": expected 'concat' or 'interleaved', got '", name, "'");
}

ScaleRule parse_scale_rule(const std::string& name, const char* arg) {
  if (name == "floor") return ScaleRule::Floor;
  if (name == "ceil") return ScaleRule::Ceil;
  raise<ValueError>(arg, ": expected 'floor' or 'ceil', got '", name, "'");
}

// ---- attention ------------------------------------------------------------------------------

namespace {

// Caches are [num_blocks, block_size, num_kv_heads, head_dim] with the dtype of `like`.
void check_kv_caches(const TensorView& key_cache, const TensorView& value_cache,
                     const TensorView& like, const char* like_arg) {
  check_dense(key_cache, "key_cache", kFloating, 4);
  check_same_dtype(key_cache, "key_cache", like, like_arg);
  check_dense(value_cache, "value_cache", kFloating, 4);
  check_shape(value_cache, "value_cache",
              {key_cache.size(0), key_cache.size(1), key_cache.size(2), key_cache.size(3)});
  check_same_dtype(value_cache, "value_cache", key_cache, "key_cache");
  if (key_cache.size(1) < 1 || key_cache.size(2) < 1) {
    raise<ValueError>("key_cache: block_size and num_kv_heads must be >= 1, got ",
                      key_cache.describe());
  }
}

}  // namespace

void reshape_and_cache(const TensorView& key, const TensorView& value, const TensorView& key_cache,
                       const TensorView& value_cache, const TensorView& slot_mapping) {
  const bool on_gpu = check_devices("key", key, {{"value", &value}, {"key_cache", &key_cache},
                             {"value_cache", &value_cache}, {"slot_mapping", &slot_mapping}});
  check_rows(key, "key", kFloating, 3);
  check_rows(value, "value", kFloating, 3);
  check_shape(value, "value", {key.size(0), key.size(1), key.size(2)});
  check_same_dtype(value, "value", key, "key");
  check_kv_caches(key_cache, value_cache, key, "key");
  check_shape(key_cache, "key_cache", {-1, -1, key.size(1), key.size(2)});
  check_dense(slot_mapping, "slot_mapping", {DType::Int64}, 1);
  check_shape(slot_mapping, "slot_mapping", {key.size(0)});
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1);
  for (int64_t t = 0; !on_gpu && t < slot_mapping.size(0); ++t) {
    const int64_t slot = int_at(slot_mapping, t);
    if (slot < -1 || slot >= num_slots) {
      raise<ValueError>("slot_mapping: entry ", t, " = ", slot, " is outside [-1, ", num_slots,
                        ") (-1 skips a padding token)");
    }
  }
  GNOMON_RUN(on_gpu, reshape_and_cache(key, value, key_cache, value_cache, slot_mapping));
}

namespace {

// With a sliding window, the entries wholly before the first query's window are never read: they
// may be -1, the null block a sliding KV-cache group leaves where it released a block.
void check_attention_indices(const TensorView& query_start_loc, const TensorView& seq_lens,
                             const TensorView& block_tables, const TensorView& key_cache,
                             int64_t batch, int64_t num_tokens, int64_t sliding_window) {
  if (int_at(query_start_loc, 0) != 0 || int_at(query_start_loc, batch) != num_tokens) {
    raise<ValueError>("query_start_loc: must start at 0 and end at the number of query tokens (",
                      num_tokens, ")");
  }
  const int64_t block_size = key_cache.size(1), num_blocks = key_cache.size(0);
  const int64_t capacity = block_tables.size(1) * block_size;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = int_at(query_start_loc, b + 1) - int_at(query_start_loc, b);
    if (q_len < 0) {
      raise<ValueError>("query_start_loc: must be non-decreasing; entry ", b + 1, " is below entry ", b);
    }
    const int64_t seq_len = int_at(seq_lens, b);
    if (seq_len < q_len || seq_len > capacity) {
      raise<ValueError>("seq_lens: entry ", b, " = ", seq_len, " must count the sequence's ",
                        q_len, " new tokens and fit the block table's capacity of ", capacity,
                        " tokens");
    }
    const int32_t* table = block_tables.ptr<const int32_t>() + b * block_tables.size(1);
    const int64_t first_key = sliding_window > 0
                                  ? std::max<int64_t>(0, seq_len - q_len - sliding_window + 1)
                                  : 0;
    for (int64_t i = 0; i < (seq_len + block_size - 1) / block_size; ++i) {
      const bool read = (i + 1) * block_size > first_key;
      if (table[i] >= num_blocks || table[i] < (read ? 0 : -1)) {
        raise<ValueError>("block_tables: entry [", b, ", ", i, "] = ", table[i], " is outside [",
                          read ? "0" : "-1", ", ", num_blocks, ")",
                          read ? "" : " (it lies before the window: -1, the null block, is allowed)");
      }
    }
  }
}

}  // namespace

void paged_attention(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                     const TensorView& value_cache, const TensorView& block_tables,
                     const TensorView& seq_lens, const TensorView& query_start_loc, double scale,
                     int64_t sliding_window, const TensorView* sinks) {
  const bool on_gpu = check_devices(
      "query", query,
      {{"out", &out}, {"key_cache", &key_cache}, {"value_cache", &value_cache},
       {"block_tables", &block_tables}, {"seq_lens", &seq_lens},
       {"query_start_loc", &query_start_loc}, {"sinks", sinks}});
  check_rows(query, "query", kFloating, 3);
  const int64_t num_tokens = query.size(0), num_heads = query.size(1), head_dim = query.size(2);
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    raise<ValueError>("query: head dim must be in [1, ", kMaxHeadDim, "], got ", query.describe());
  }
  check_kv_caches(key_cache, value_cache, query, "query");
  const int64_t num_kv_heads = key_cache.size(2);
  if (key_cache.size(3) != head_dim) {
    raise<ValueError>("key_cache: head dim ", key_cache.size(3), " does not match query's ",
                      head_dim);
  }
  if (num_heads % num_kv_heads != 0) {
    raise<ValueError>("query: the number of query heads (", num_heads,
                      ") must be a multiple of key_cache's KV heads (", num_kv_heads, ")");
  }
  check_dense(out, "out", kFloating, 3);
  check_shape(out, "out", {num_tokens, num_heads, head_dim});
  check_same_dtype(out, "out", query, "query");
  check_dense(block_tables, "block_tables", {DType::Int32}, 2);
  const int64_t batch = block_tables.size(0);
  check_dense(seq_lens, "seq_lens", {DType::Int32}, 1);
  check_shape(seq_lens, "seq_lens", {batch});
  check_dense(query_start_loc, "query_start_loc", {DType::Int32}, 1);
  check_shape(query_start_loc, "query_start_loc", {batch + 1});
  if (sinks != nullptr) {
    check_dense(*sinks, "sinks", {DType::Float32}, 1);
    check_shape(*sinks, "sinks", {num_heads});
  }
  check_finite(scale, "scale");
  if (sliding_window < 0) {
    raise<ValueError>("sliding_window: expected None or a positive integer, got ", sliding_window);
  }

  if (!on_gpu) {
    check_attention_indices(query_start_loc, seq_lens, block_tables, key_cache, batch, num_tokens,
                            sliding_window);
  }
  GNOMON_RUN(on_gpu, paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                                     query_start_loc, scale, sliding_window, sinks));
}

// ---- normalisation and rotary embedding -----------------------------------------------------

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
              const TensorView* residual) {
  const bool on_gpu =
      check_devices("x", x, {{"out", &out}, {"weight", &weight}, {"residual", residual}});
  check_dense(x, "x", kFloating, 2);
  check_dense(weight, "weight", kFloating, 1);
  check_shape(weight, "weight", {x.size(1)});
  check_same_dtype(weight, "weight", x, "x");
  check_dense(out, "out", kFloating, 2);
  check_shape(out, "out", {x.size(0), x.size(1)});
  check_same_dtype(out, "out", x, "x");
  if (residual != nullptr) {
    check_dense(*residual, "residual", kFloating, 2);
    check_shape(*residual, "residual", {x.size(0), x.size(1)});
    check_same_dtype(*residual, "residual", x, "x");
  }
  check_finite(eps, "eps");
  if (eps < 0) raise<ValueError>("eps: expected a number >= 0, got ", eps);
  GNOMON_RUN(on_gpu, rms_norm(out, x, weight, eps, residual));
}

void rotary_embedding(const TensorView& positions, const TensorView& query, const TensorView& key,
                      const TensorView& cos_sin_cache, bool is_neox) {
  const bool on_gpu = check_devices("query", query, {{"positions", &positions}, {"key", &key},
                                                     {"cos_sin_cache", &cos_sin_cache}});
  check_rows(query, "query", kFloating, 3);
  check_rows(key, "key", kFloating, 3);
  check_same_dtype(key, "key", query, "query");
  check_shape(key, "key", {query.size(0), -1, query.size(2)});
  check_dense(positions, "positions", {DType::Int64}, 1);
  check_shape(positions, "positions", {query.size(0)});
  check_dense(cos_sin_cache, "cos_sin_cache", {DType::Float32}, 2);
  const int64_t rotary_dim = cos_sin_cache.size(1);
  if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > query.size(2)) {
    raise<ValueError>("cos_sin_cache: rotary dim (its second size) must be even, >= 2 and at most "
                      "the head dim ", query.size(2), ", got ", cos_sin_cache.describe());
  }
  for (int64_t t = 0; !on_gpu && t < positions.size(0); ++t) {
    const int64_t pos = int_at(positions, t);
    if (pos < 0 || pos >= cos_sin_cache.size(0)) {
      raise<ValueError>("positions: entry ", t, " = ", pos, " is outside cos_sin_cache's [0, ",
                        cos_sin_cache.size(0), ")");
    }
  }
  GNOMON_RUN(on_gpu, rotary_embedding(positions, query, key, cos_sin_cache, is_neox));
}

// ---- mixture of experts ---------------------------------------------------------------------

void topk_routing(const TensorView& topk_weights, const TensorView& topk_ids,
                  const TensorView& router_logits, int64_t top_k, RoutingMode mode,
                  bool renormalize) {
  const bool on_gpu = check_devices("router_logits", router_logits,
                                    {{"topk_weights", &topk_weights}, {"topk_ids", &topk_ids}});
  check_dense(router_logits, "router_logits", kFloating, 2);
  const int64_t num_experts = router_logits.size(1);
  if (top_k < 1 || top_k > num_experts || top_k > kMaxTopK) {
    raise<ValueError>("top_k: expected 1 <= top_k <= min(num_experts = ", num_experts, ", ",
                      kMaxTopK, "), got ", top_k);
  }
  check_dense(topk_weights, "topk_weights", {DType::Float32}, 2);
  check_shape(topk_weights, "topk_weights", {router_logits.size(0), top_k});
  check_dense(topk_ids, "topk_ids", {DType::Int32}, 2);
  check_shape(topk_ids, "topk_ids", {router_logits.size(0), top_k});
  GNOMON_RUN(on_gpu, topk_routing(topk_weights, topk_ids, router_logits, top_k, mode, renormalize));
}

void fused_moe(const TensorView& out, const TensorView& hidden, const TensorView& w13,
               const TensorView& w2, const TensorView& topk_weights, const TensorView& topk_ids,
               Activation activation, GateUpLayout gate_up_layout, const TensorView* w13_bias,
               const TensorView* w2_bias, const TensorView* w13_scales,
               const TensorView* w2_scales) {
  const bool on_gpu = check_devices("hidden", hidden,
                {{"out", &out}, {"w13", &w13}, {"w2", &w2}, {"topk_weights", &topk_weights},
                 {"topk_ids", &topk_ids}, {"w13_bias", w13_bias}, {"w2_bias", w2_bias},
                 {"w13_scales", w13_scales}, {"w2_scales", w2_scales}});
  check_dense(hidden, "hidden", kFloating, 2);
  const int64_t num_tokens = hidden.size(0), hidden_size = hidden.size(1);
  const bool mxfp4 = w13.dtype == DType::UInt8;
  check_dense(w13, "w13", {hidden.dtype, DType::UInt8}, 3);
  check_dense(w2, "w2", {w13.dtype}, 3);
  const int64_t num_experts = w13.size(0);
  const int64_t intermediate = w2.size(2) * (mxfp4 ? 2 : 1);
  if (w13.size(1) != 2 * intermediate) {
    raise<ValueError>("w13: expected 2 * I = ", 2 * intermediate, " rows per expert (I from w2), got ",
                      w13.describe());
  }
  if (mxfp4) {
    if (hidden_size % 32 != 0 || intermediate % 32 != 0) {
      raise<ValueError>("w13: MXFP4 experts need H and I divisible by 32, got H = ", hidden_size,
                        ", I = ", intermediate);
    }
    check_shape(w13, "w13", {num_experts, 2 * intermediate, hidden_size / 2});
    check_shape(w2, "w2", {num_experts, hidden_size, intermediate / 2});
    if (w13_scales == nullptr || w2_scales == nullptr) {
      raise<ValueError>(w13_scales == nullptr ? "w13_scales" : "w2_scales",
                        ": required when the expert weights are MXFP4 (uint8)");
    }
    check_dense(*w13_scales, "w13_scales", {DType::UInt8}, 3);
    check_shape(*w13_scales, "w13_scales", {num_experts, 2 * intermediate, hidden_size / 32});
    check_dense(*w2_scales, "w2_scales", {DType::UInt8}, 3);
    check_shape(*w2_scales, "w2_scales", {num_experts, hidden_size, intermediate / 32});
  } else {
    check_shape(w13, "w13", {num_experts, 2 * intermediate, hidden_size});
    check_shape(w2, "w2", {num_experts, hidden_size, intermediate});
    if (w13_scales != nullptr || w2_scales != nullptr) {
      raise<ValueError>(w13_scales != nullptr ? "w13_scales" : "w2_scales",
                        ": only MXFP4 (uint8) expert weights take scales");
    }
  }
  if (num_experts < 1 || intermediate < 1) {
    raise<ValueError>("w13: expected at least one expert and I >= 1, got ", w13.describe());
  }
  if (w13_bias != nullptr) {
    check_dense(*w13_bias, "w13_bias", {hidden.dtype}, 2);
    check_shape(*w13_bias, "w13_bias", {num_experts, 2 * intermediate});
  }
  if (w2_bias != nullptr) {
    check_dense(*w2_bias, "w2_bias", {hidden.dtype}, 2);
    check_shape(*w2_bias, "w2_bias", {num_experts, hidden_size});
  }
  check_dense(topk_weights, "topk_weights", {DType::Float32}, 2);
  const int64_t top_k = topk_weights.size(1);
  check_shape(topk_weights, "topk_weights", {num_tokens, top_k});
  check_dense(topk_ids, "topk_ids", {DType::Int32}, 2);
  check_shape(topk_ids, "topk_ids", {num_tokens, top_k});
  check_dense(out, "out", kFloating, 2);
  check_shape(out, "out", {num_tokens, hidden_size});
  check_same_dtype(out, "out", hidden, "hidden");
  for (int64_t i = 0; !on_gpu && i < topk_ids.numel(); ++i) {
    const int64_t id = topk_ids.ptr<const int32_t>()[i];
    if (id < 0 || id >= num_experts) {
      raise<ValueError>("topk_ids: entry [", i / top_k, ", ", i % top_k, "] = ", id,
                        " is outside [0, ", num_experts, ")");
    }
  }
  GNOMON_RUN(on_gpu, fused_moe(out, hidden, w13, w2, topk_weights, topk_ids, activation,
                               gate_up_layout, w13_bias, w2_bias, w13_scales, w2_scales));
}

// ---- MXFP4 ----------------------------------------------------------------------------------

namespace {

// packed [N, K/2] and scales [N, K/32] for a K given by the caller.
void check_mxfp4_operand(const TensorView& packed, const char* packed_arg, const TensorView& scales,
                         const char* scales_arg, int64_t rows, int64_t k) {
  check_dense(packed, packed_arg, {DType::UInt8}, 2);
  check_shape(packed, packed_arg, {rows, k / 2});
  check_dense(scales, scales_arg, {DType::UInt8}, 2);
  check_shape(scales, scales_arg, {rows, k / 32});
}

void check_k(int64_t k, const char* arg) {
  if (k % 32 != 0) raise<ValueError>(arg, ": K (the last dim) must be a multiple of 32, got ", k);
}

}  // namespace

void mxfp4_quantize(const TensorView& packed, const TensorView& scales, const TensorView& x,
                    ScaleRule scale_rule) {
  const bool on_gpu = check_devices("x", x, {{"packed", &packed}, {"scales", &scales}});
  check_dense(x, "x", kFloating, 2);
  check_k(x.size(1), "x");
  check_mxfp4_operand(packed, "packed", scales, "scales", x.size(0), x.size(1));
  GNOMON_RUN(on_gpu, mxfp4_quantize(packed, scales, x, scale_rule));
}

void mxfp4_dequantize(const TensorView& out, const TensorView& packed, const TensorView& scales) {
  const bool on_gpu = check_devices("packed", packed, {{"out", &out}, {"scales", &scales}});
  check_dense(out, "out", kFloating, 2);
  check_k(out.size(1), "out");
  check_mxfp4_operand(packed, "packed", scales, "scales", out.size(0), out.size(1));
  GNOMON_RUN(on_gpu, mxfp4_dequantize(out, packed, scales));
}

void mxfp4_gemm(const TensorView& out, const TensorView& a, const TensorView& w,
                const TensorView& w_scales, const TensorView* bias) {
  const bool on_gpu =
      check_devices("a", a, {{"out", &out}, {"w", &w}, {"w_scales", &w_scales}, {"bias", bias}});
  check_dense(a, "a", kFloating, 2);
  check_k(a.size(1), "a");
  check_dense(w, "w", {DType::UInt8}, 2);
  const int64_t n = w.size(0);
  check_mxfp4_operand(w, "w", w_scales, "w_scales", n, a.size(1));
  if (bias != nullptr) {
    check_dense(*bias, "bias", kFloating, 1);
    check_shape(*bias, "bias", {n});
  }
  check_dense(out, "out", kFloating, 2);
  check_shape(out, "out", {a.size(0), n});
  GNOMON_RUN(on_gpu, mxfp4_gemm(out, a, w, w_scales, bias));
}

}  // namespace gnomon
