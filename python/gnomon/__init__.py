"""gnomon: kernels, a small engine and step-cost prediction for LLM inference.

Importing gnomon does not import torch; the op layer does, when it is first used.
"""

from gnomon import _compiled  # first: it routes the imports of the Cython-compiled modules
_compiled.install(__path__)

from gnomon import _C
from gnomon._C import BlockAllocator

__version__ = _C.__version__

__all__ = ["BlockAllocator", "__version__"]

_ENGINE_EXPORTS = ("LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput",
                   "CompletionOutput")
__all__ += list(_ENGINE_EXPORTS)


def __getattr__(name):  # lazy, so that importing gnomon does not import torch
    if name in _ENGINE_EXPORTS:
        from gnomon import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'gnomon' has no attribute {name!r}")
