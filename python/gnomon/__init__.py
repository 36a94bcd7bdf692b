"""gnomon: kernels, a small engine and step-cost prediction for LLM inference.

Importing gnomon does not import torch; the op layer does, when it is first used.
"""

from gnomon import _C
from gnomon._C import BlockAllocator

__version__ = _C.__version__

__all__ = ["BlockAllocator", "__version__"]
