"""Per-call host cost of an op through its public wrapper: a [1, 64] rms_norm, eager, where the
kernel itself takes well under a microsecond, against torch's own rms_norm on the same tensors.
Goal (issue 17): <= 4 us per gnomon call."""

import pytest
import torch

import gnomon.ops as ops
from conftest import note, record, speedup

SUITE = "host cost [1, 64] rms_norm"
GOAL_US = 4.0


@pytest.mark.parametrize("implementation", ["gnomon", "torch"])
def test_rms_norm_call(benchmark, implementation):
    x, weight = torch.randn(1, 64), torch.randn(64)
    if implementation == "gnomon":
        call = lambda: ops.rms_norm(x, weight, 1e-6)  # noqa: E731
    else:
        call = lambda: torch.nn.functional.rms_norm(x, (64,), weight, 1e-6)  # noqa: E731
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6),
                               torch.nn.functional.rms_norm(x, (64,), weight, 1e-6))
    benchmark.pedantic(call, rounds=20, iterations=2000, warmup_rounds=2)
    record(SUITE, implementation, benchmark)
    speedup(SUITE, "gnomon", "torch")
    if benchmark.stats is not None and implementation == "gnomon":
        per_call = benchmark.stats.stats.min * 1e6  # the quietest round: host cost, not noise
        note(f"{SUITE}: gnomon {per_call:.2f} us per call, best round "
             f"(goal <= {GOAL_US:g} us: {'met' if per_call <= GOAL_US else 'NOT met'})")
