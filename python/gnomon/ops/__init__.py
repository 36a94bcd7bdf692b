"""gnomon's public ops: validated wrappers over the C++ kernels, registered as torch.library ops.

Every op is also ``torch.ops.gnomon.<name>`` with a fake implementation, so modules that call
them trace under ``torch.compile(fullgraph=True)``. The kernels use ``num_threads()`` threads,
which follows ``torch.get_num_threads()`` unless ``set_num_threads`` pins it.
"""

from gnomon._extras import require_torch

require_torch("gnomon.ops")

from gnomon.ops._tensor import num_threads, set_num_threads  # noqa: E402
from gnomon.ops.attention import paged_attention, reshape_and_cache  # noqa: E402
from gnomon.ops.moe import fused_moe, topk_routing  # noqa: E402
from gnomon.ops.mxfp4 import mxfp4_dequantize, mxfp4_gemm, mxfp4_quantize  # noqa: E402
from gnomon.ops.norm import rms_norm, rotary_embedding  # noqa: E402

__all__ = [
    "fused_moe", "mxfp4_dequantize", "mxfp4_gemm", "mxfp4_quantize", "num_threads",
    "paged_attention", "reshape_and_cache", "rms_norm", "rotary_embedding", "set_num_threads",
    "topk_routing",
]
