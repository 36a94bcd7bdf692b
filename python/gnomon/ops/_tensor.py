"""Argument checks shared by the op wrappers, and the one way a tensor crosses into C++.

The wrappers check their scalar arguments on every call. The C++ entry checks every tensor
(dtype, shape, layout, device, and index values) before it touches data. The wrappers' own tensor
checks run while torch.compile traces (on fake tensors, which never reach C++) and after C++ has
refused a call, to word the error in the caller's terms (see `call`).
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import torch

from gnomon import _C

FLOATING = (torch.float32, torch.bfloat16, torch.float16)

_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.uint8: 3,
                torch.int32: 4, torch.int64: 5}
_CPU = 0
_GPU = 2 if torch.version.hip else 1  # a ROCm torch reports its devices as cuda

LAYOUTS = ("contiguous", "rows")


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def has_contiguous_rows(t: torch.Tensor) -> bool:
    """Whether each index of dim 0 of `t` (a row: one token) is contiguous, the rows at least a
    row's elements apart: a contiguous tensor, or a column slice of one such as
    ``qkv[:, a:b].view(T, H, D)``. Dims of size 1 take any stride, as in torch's contiguity;
    so does dim 0 with one row or none. The rule of TensorView::has_contiguous_rows in C++."""
    if t.is_contiguous():
        return True
    shape, strides = t.shape, t.stride()
    expected = 1
    for d in range(t.dim() - 1, 0, -1):
        if shape[d] != 1 and strides[d] != expected:
            return False
        expected *= shape[d]
    return shape[0] <= 1 or strides[0] >= expected


def check_tensor(t, name: str, *, dtypes: Sequence[torch.dtype], dim: Optional[int] = None,
                 shape: Optional[Sequence[Optional[int]]] = None,
                 layout: str = "contiguous") -> None:
    """Raises TypeError/ValueError naming `name` unless `t` is a tensor of the given kind.

    `shape` entries of None match any size; `shape` implies `dim`. `layout` is "contiguous", or
    "rows" for an operand whose rows may lie any stride apart (`has_contiguous_rows`).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtype_names(dtypes)}, got "
                        f"{str(t.dtype).removeprefix('torch.')}")
    if shape is not None:
        if t.shape != shape:  # torch.Size compares with a tuple in C; a None entry never equals
            _check_shape(t, name, shape)
    elif dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {tuple(t.shape)}")
    if layout == "contiguous":
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got "
                             f"strides {t.stride()}")
    elif layout == "rows":
        if not has_contiguous_rows(t):
            raise ValueError(f"{name}: expected each row (index of dim 0) contiguous and rows a "
                             f"stride of at least a row's elements apart, as a contiguous tensor "
                             f"or a column slice of one is (call .contiguous()), got shape "
                             f"{tuple(t.shape)} with strides {t.stride()}")
    else:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def _check_shape(t: torch.Tensor, name: str, shape: Sequence[Optional[int]]) -> None:
    if t.dim() != len(shape):
        raise ValueError(f"{name}: expected a {len(shape)}-D tensor, got shape {tuple(t.shape)}")
    for have, want in zip(t.shape, shape):
        if want is not None and have != want:
            want = ", ".join("*" if s is None else str(s) for s in shape)
            raise ValueError(f"{name}: expected shape ({want}), got {tuple(t.shape)}")


def check_same_device(**tensors: Optional[torch.Tensor]) -> None:
    """All given tensors (None skipped) must share the first one's device."""
    for t in tensors.values():
        if t is not None and not t.is_cpu:
            break
    else:
        return  # all on the CPU: no device objects to build and compare
    lead_name = lead = None
    for name, t in tensors.items():
        if t is None:
            continue
        if lead is None:
            lead_name, lead = name, t
        elif t.device != lead.device:
            raise ValueError(f"{name}: expected a tensor on {lead.device} like {lead_name}, "
                             f"got {t.device}")


def check_choice(value, name: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")


def view(t: Optional[torch.Tensor]) -> Optional[tuple]:
    """The borrowed view the C++ entries take, as the tuple (data pointer, dtype code, shape,
    strides, device code, device index, stream) that C++ reads into a TensorView and checks.
    The tensor must outlive the call."""
    if t is None:
        return None
    try:
        code = _DTYPE_CODES[t.dtype]
    except KeyError:
        raise TypeError(f"tensor of dtype {t.dtype}: gnomon's kernels take "
                        f"{_dtype_names(_DTYPE_CODES)}") from None
    if t.is_cpu:  # t.shape is a torch.Size, a tuple: C++ reads it as it is
        return (t.data_ptr(), code, t.shape, t.stride(), _CPU, 0, 0)
    if not t.is_cuda:
        raise ValueError(f"tensor on {t.device}: gnomon has kernels for cpu, cuda and hip tensors")
    # GPU ops run on torch's current stream of the tensor's device
    device = t.device
    return (t.data_ptr(), code, t.shape, t.stride(), _GPU, device.index or 0,
            torch.cuda.current_stream(device).cuda_stream)


def view_like(t: torch.Tensor, like_view: tuple) -> tuple:
    """The view of `t`, made by ``torch.empty_like`` of a tensor whose view is `like_view`, from
    its data pointer alone (a second view costs ~0.5 us a call): empty_like gives a dense tensor
    its dtype, shape, strides and device. Only for a `like` that the C++ entry requires dense,
    so that a strided one is refused by name before `t` is written."""
    return (t.data_ptr(),) + like_view[1:]


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


def call(op, check, *args):
    """Runs a gnomon op whose wrapper has already checked its scalar arguments.

    While torch.compile traces, `check(*args)` checks the tensors (fake ones) and the registered
    op goes into the graph. Eagerly, the op's implementation runs at once, which skips about
    17 µs of dispatcher overhead (a [1, 64] rms_norm on the CI machine), and the C++ entry checks
    every tensor before it reads or writes any. Only a refused call runs `check`, so that the
    error names the argument as the caller passed it (an N-D `x`, not the rows C++ was given)."""
    if torch.compiler.is_compiling():
        check(*args)
        return op(*args)
    try:
        return op.eager_impl(*args)
    except Exception:
        _raise_named(check, args)
        raise


def _raise_named(check, args) -> None:
    try:
        check(*args)
    except (TypeError, ValueError) as named:
        raise named from None  # the wrapper's wording replaces the refusal it explains
