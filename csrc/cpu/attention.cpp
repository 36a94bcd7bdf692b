// PLACEHOLDER: replaced by the attention family's kernels.
#include "core/errors.h"
#include "cpu/kernels.h"
namespace gnomon::cpu {
void reshape_and_cache(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&) { raise<ValueError>("not built yet"); }
void paged_attention(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, double, int64_t, const TensorView*) { raise<ValueError>("not built yet"); }
}  // namespace gnomon::cpu
