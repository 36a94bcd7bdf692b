"""A site-data fixture with a planted regression: two benchmarks over six commits; the first
gets 15% slower at the fourth commit, which `steps` lists as open and `compare` flags."""

from __future__ import annotations

import copy
import hashlib

import pytest

FINGERPRINT = "0123456789abcdef"
COMMITS = [hashlib.sha1(f"commit {i}".encode()).hexdigest() for i in range(6)]
SLOW = "attention/paged_decode[batch=8,context=1024]"
STEADY = "attention/paged_decode[batch=64,context=1024]"
ACCURACY = "accuracy/step_ape_median[model=small-llama,predictor=calibrated,tp=1]"


def _series(base_ns: float, step_at: int | None, flops: int, nbytes: int) -> list[dict]:
    wobble = [1.0, 1.01, 0.99, 1.0, 1.01, 0.995]
    points = []
    for i, commit in enumerate(COMMITS):
        median = base_ns * wobble[i] * (1.15 if step_at is not None and i >= step_at else 1.0)
        points.append({"commit": commit, "commit_order": i, "median_ns": median,
                       "q1_ns": median * 0.97, "q3_ns": median * 1.04, "runs": 3,
                       "flops": flops, "bytes": nbytes, "tflops": flops / median / 1e3,
                       "gbps": nbytes / median})
    return points


def make_data() -> dict:
    return {
        "machines": [{"fingerprint": FINGERPRINT, "device": "cpu",
                      "cpu_model": "Test CPU @ 3.0GHz", "cores": 2, "ram_gb": 8,
                      "gpu_name": None}],
        "benchmarks": [
            {"key": SLOW, "suite": "attention", "op": "paged_decode",
             "params": {"batch": 8, "context": 1024, "dtype": "bf16"},
             "definition_hash": "aaaaaaaaaaaaaaaa", "machine": FINGERPRINT,
             "series": _series(2.0e6, 3, flops=2 * 8 * 32 * 1024 * 128 * 2,
                               nbytes=8 * 1024 * 8 * 128 * 2 * 2),
             "steps": [{"commit": COMMITS[3], "ratio": 1.15, "q": 0.0012, "state": "open",
                        "reason": None}]},
            {"key": STEADY, "suite": "attention", "op": "paged_decode",
             "params": {"batch": 64, "context": 1024, "dtype": "bf16"},
             "definition_hash": "bbbbbbbbbbbbbbbb", "machine": FINGERPRINT,
             "series": _series(9.0e6, None, flops=2 * 64 * 32 * 1024 * 128 * 2,
                               nbytes=64 * 1024 * 8 * 128 * 2 * 2),
             "steps": []},
        ],
        "compare": {"base": COMMITS[2], "head": COMMITS[3], "machine": FINGERPRINT,
                    "rows": [{"key": SLOW, "base_median_ns": 1.98e6, "head_median_ns": 2.3e6,
                              "ratio": 1.1616, "q": 0.002, "verdict": "REGRESSION"},
                             {"key": STEADY, "base_median_ns": 8.91e6, "head_median_ns": 9.0e6,
                              "ratio": 1.0101, "q": 0.6, "verdict": "SAME"}]},
        "peaks": {FINGERPRINT: {"memory_gbps": 40.0, "tflops": {"bf16": 1.2, "fp32": 0.6}}},
        "accuracy": [{"series": ACCURACY, "machine": FINGERPRINT, "steps": [COMMITS[4]],
                      "points": [{"commit": c, "commit_order": i,
                                  "value": 0.06 if i < 4 else 0.12, "noise_floor": 0.03,
                                  "validations": 1} for i, c in enumerate(COMMITS)]}],
    }


@pytest.fixture
def data() -> dict:
    return copy.deepcopy(make_data())
