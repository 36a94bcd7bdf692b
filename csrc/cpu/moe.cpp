// PLACEHOLDER: replaced by the moe family's kernels.
#include "core/errors.h"
#include "cpu/kernels.h"
namespace gnomon::cpu {
void topk_routing(const TensorView&, const TensorView&, const TensorView&, int64_t, RoutingMode, bool) { raise<ValueError>("not built yet"); }
void fused_moe(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, Activation, GateUpLayout, const TensorView*, const TensorView*, const TensorView*, const TensorView*) { raise<ValueError>("not built yet"); }
}  // namespace gnomon::cpu
