// PLACEHOLDER: replaced by the mxfp4 family's kernels.
#include "core/errors.h"
#include "cpu/kernels.h"
namespace gnomon::cpu {
void mxfp4_quantize(const TensorView&, const TensorView&, const TensorView&, ScaleRule) { raise<ValueError>("not built yet"); }
void mxfp4_dequantize(const TensorView&, const TensorView&, const TensorView&) { raise<ValueError>("not built yet"); }
void mxfp4_gemm(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView*) { raise<ValueError>("not built yet"); }
}  // namespace gnomon::cpu
