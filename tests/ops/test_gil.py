"""The C++ entries release the GIL while a kernel runs."""

import threading
import time

import pytest
import torch

from gnomon import _C
from gnomon.ops._tensor import view


@pytest.mark.timing
def test_python_threads_run_while_a_kernel_runs():
    x = torch.randn(2048, 8192)
    weight, out = torch.ones(8192), torch.empty_like(x)
    _C.set_num_threads(1)  # one slow kernel call, long enough to observe
    try:
        started, finished = threading.Event(), threading.Event()

        def kernel():
            started.set()
            for _ in range(5):
                _C.rms_norm(view(out), view(x), view(weight), 1e-6, None)
            finished.set()

        worker = threading.Thread(target=kernel)
        worker.start()
        started.wait()
        ticks = 0
        while not finished.is_set():
            ticks += 1
            time.sleep(0)
        worker.join()
    finally:
        from gnomon.ops import set_num_threads

        set_num_threads(None)
        _C.set_num_threads(torch.get_num_threads())
    # With the GIL held for each whole kernel call, this thread could only tick between calls.
    assert ticks > 50, ticks
