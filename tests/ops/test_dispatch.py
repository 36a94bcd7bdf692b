"""Device dispatch in csrc/ops.cpp, checked without a GPU: views of GPU memory reach the C++
entries as plain descriptors, so a CPU-only build must refuse them by device before touching
the memory, and a GPU build must route them to its own backend only."""

import pytest
import torch

from gnomon import _C
from gnomon.ops._tensor import view

CPU, CUDA, HIP = 0, 1, 2
BACKENDS = _C.build_info()["gpu_backends"]


def fake_gpu_view(shape, dtype_code, device):
    """A view that claims GPU memory at an address nothing may dereference."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return (0xdead0000, dtype_code, tuple(shape), tuple(strides), device, 0, 0x1234)


@pytest.mark.parametrize("device", [CUDA, HIP])
def test_views_of_a_backend_not_built_are_refused_by_device(device):
    if ("cuda", "hip")[device - 1] in BACKENDS:
        pytest.skip("this build has that backend")
    x = fake_gpu_view([4, 64], 0, device)
    w = fake_gpu_view([64], 0, device)
    with pytest.raises(ValueError, match=r"x: this build of gnomon has no kernels for (cuda|hip)"):
        _C.rms_norm(x, x, w, 1e-6, None)


def test_cpu_views_carry_no_stream():
    t, w = torch.full((3, 5), 2.0), torch.ones(5)  # views borrow: the tensors must outlive them
    v = view(t)
    assert v[2] == (3, 5) and v[3] == (5, 1) and v[6] == 0
    assert _C.describe_view(v) == "float32[3, 5] on cpu"
    _C.rms_norm(v, v, view(w), 1e-6, None)  # the CPU path still runs: 2 / rms(2) = 1
    assert torch.allclose(t, torch.ones(3, 5), atol=1e-3)


def test_mixed_devices_are_refused_before_any_access():
    x = view(torch.ones(4, 64))
    w = fake_gpu_view([64], 0, CUDA)
    with pytest.raises(ValueError, match=r"weight: expected a tensor on the same device as x "
                                         r"\(cpu:0\), got cuda:0"):
        _C.rms_norm(x, x, w, 1e-6, None)


@pytest.mark.parametrize("bad, error, match", [
    ([0x1000, 0, (2,), (1,), 0, 0, 0], TypeError, "TensorView: expected a tuple"),
    ((0x1000, 0, (2,), (1,), 0, 0), TypeError, "TensorView: expected a tuple"),
    ((-1, 0, (2,), (1,), 0, 0, 0), ValueError, "TensorView data"),
    ((0x1000, 6, (2,), (1,), 0, 0, 0), ValueError, "TensorView dtype"),
    ((0x1000, True, (2,), (1,), 0, 0, 0), TypeError, "TensorView dtype"),
    ((0x1000, 0, [2], (1,), 0, 0, 0), TypeError, "TensorView shape"),
    ((0x1000, 0, (2, "x"), (1, 1), 0, 0, 0), TypeError, "TensorView shape: entry 1"),
    ((0x1000, 0, (2,), (1, 1), 0, 0, 0), ValueError, "TensorView strides"),
    ((0x1000, 0, (-2,), (1,), 0, 0, 0), ValueError, "TensorView shape"),
    ((0x1000, 0, (1,) * 9, (1,) * 9, 0, 0, 0), ValueError, "at most 8 dims"),
    ((0x1000, 0, (2,), (1 << 63,), 0, 0, 0), ValueError, "TensorView strides: entry 0"),
    ((0x1000, 0, (2,), (1,), 3, 0, 0), ValueError, "TensorView device"),
    ((0x1000, 0, (2,), (1,), 0, -1, 0), ValueError, "TensorView device_index"),
    ((0, 0, (2,), (1,), 0, 0, 0), ValueError, "TensorView data: null pointer"),
])
def test_malformed_view_tuples_are_refused_by_field(bad, error, match):
    """The C++ side reads a view tuple field by field and names the field it cannot accept."""
    with pytest.raises(error, match=match):
        _C.describe_view(bad)
    w = view(torch.ones(2))
    with pytest.raises(error, match=match):
        _C.rms_norm(bad, w, w, 1e-6, None)
