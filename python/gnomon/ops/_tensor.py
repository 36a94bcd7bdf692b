"""Argument checks shared by the op wrappers, and the one way a tensor crosses into C++.

The wrappers check dtype, shape, device and contiguity before the op runs (also while tracing
under torch.compile, on fake tensors). Checks that need tensor values (indices in range) happen
in the C++ entry, which re-checks everything else too.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

from gnomon import _C

FLOATING = (torch.float32, torch.bfloat16, torch.float16)

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.uint8: 3,
                torch.int32: 4, torch.int64: 5}
_CPU, _CUDA, _HIP = 0, 1, 2


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(t, name: str, *, dtypes: Sequence[torch.dtype], dim: Optional[int] = None,
                 shape: Optional[Sequence[Optional[int]]] = None, contiguous: bool = True) -> None:
    """Raises TypeError/ValueError naming `name` unless `t` is a tensor of the given kind.

    `shape` entries of None match any size; `shape` implies `dim`.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)}, got "
                        f"{str(t.dtype).removeprefix('torch.')}")
    if shape is not None:
        dim = len(shape)
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {tuple(t.shape)}")
    if shape is not None and any(s is not None and t.shape[i] != s for i, s in enumerate(shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name}: expected shape ({want}), got {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides "
                         f"{t.stride()}")


def check_same_device(**tensors: Optional[torch.Tensor]) -> None:
    """All given tensors (None skipped) must share the first one's device."""
    named = [(name, t) for name, t in tensors.items() if t is not None]
    lead_name, lead = named[0]
    for name, t in named[1:]:
        if t.device != lead.device:
            raise ValueError(f"{name}: expected a tensor on {lead.device} like {lead_name}, "
                             f"got {t.device}")


def check_choice(value, name: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")


def view(t: Optional[torch.Tensor]) -> Optional[_C.TensorView]:
    """The borrowed view the C++ entries take; the tensor must outlive the call."""
    if t is None:
        return None
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"tensor of dtype {t.dtype}: gnomon's kernels take "
                        f"{_dtype_names(_DTYPE_CODES)}")
    device = t.device
    if device.type == "cpu":
        return _C.TensorView(t.data_ptr(), code, tuple(t.shape), t.stride(), _CPU, 0)
    if device.type != "cuda":
        raise ValueError(f"tensor on {device}: gnomon has kernels for cpu, cuda and hip tensors")
    # GPU ops run on torch's current stream of the tensor's device
    return _C.TensorView(t.data_ptr(), code, tuple(t.shape), t.stride(),
                         _HIP if torch.version.hip else _CUDA, device.index or 0,
                         torch.cuda.current_stream(device).cuda_stream)


_explicit_threads: Optional[int] = None


def set_num_threads(n: Optional[int]) -> None:
    """Pins the kernels' thread count; None makes it follow torch.get_num_threads() again."""
    global _explicit_threads
    if n is not None:
        _C.set_num_threads(n)
    _explicit_threads = n


def num_threads() -> int:
    follow_torch_threads()
    return _C.num_threads()


def follow_torch_threads() -> None:
    if _explicit_threads is None and _C.num_threads() != torch.get_num_threads():
        _C.set_num_threads(torch.get_num_threads())


def custom_op(name: str, *, mutates_args: Sequence[str] = ()):
    """Registers the decorated function as ``torch.ops.gnomon.<name>``; use with `call`."""

    def register(fn):
        op = torch.library.custom_op(f"gnomon::{name}", fn, mutates_args=tuple(mutates_args))
        op.eager_impl = fn
        return op

    return register


def call(op, *args):
    """Runs a gnomon op: through the registered op while torch.compile traces, so graphs hold it,
    and straight into its implementation otherwise, which skips about 17 µs of dispatcher
    overhead per call (measured on the CI machine with a [1, 64] rms_norm)."""
    return op(*args) if torch.compiler.is_compiling() else op.eager_impl(*args)
