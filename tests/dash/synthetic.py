"""Synthetic results documents (valid per gnomon.bench.results.validate) for the dash tests;
the real harness is never run."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Mapping

from gnomon.bench import results

KEYS = {
    "attention/paged_attention[batch=8,ctx=1024]": ("attention", "paged_attention"),
    "attention/paged_attention[batch=32,ctx=4096]": ("attention", "paged_attention"),
    "norm/rms_norm[tokens=512,hidden=4096]": ("norm", "rms_norm"),
    "moe/fused_moe[tokens=64,experts=8]": ("moe", "fused_moe"),
}
BASE_NS = {key: 10_000.0 * (i + 1) for i, key in enumerate(KEYS)}


def sha(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def machine(name: str = "box") -> dict:
    return {"fingerprint": hashlib.sha256(name.encode()).hexdigest()[:16], "device": "cpu",
            "cpu_model": f"Synthetic CPU {name}", "cores": 16, "ram_gb": 64, "gpu_name": None,
            "driver": None, "runtime": None}


def _quartiles(samples: list[int]) -> dict:
    s = sorted(samples)
    n = len(s)

    def q(f: float) -> float:
        pos = f * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return {"count": n, "min": float(s[0]), "q1": q(0.25), "median": q(0.5), "q3": q(0.75),
            "max": float(s[-1])}


def document(commit: str, *, runs: int = 3, seed: int = 0, factors: Mapping[str, float] | None
             = None, keys: Mapping[str, tuple[str, str]] | None = None, machine_name: str = "box",
             run_noise: float = 0.01, sample_noise: float = 0.03, samples: int = 15,
             definition: str = "v1") -> dict:
    """A results document for ``commit``: every key's per-run level is its base time times
    ``factors[key]`` (default 1) with ``run_noise`` relative noise; samples scatter around it."""
    rng = random.Random(f"{commit}/{seed}/{machine_name}")
    factors = factors or {}
    keys = keys or KEYS
    doc_runs = []
    for index in range(runs):
        cases = []
        for key, (suite, op) in keys.items():
            level = BASE_NS.get(key, 20_000.0) * factors.get(key, 1.0) * (
                1 + rng.gauss(0, run_noise))
            samples_ns = [max(1, int(level * (1 + abs(rng.gauss(0, sample_noise)))))
                          for _ in range(samples)]
            stats = _quartiles(samples_ns)
            flops, nbytes = 2_000_000, 1_000_000
            cases.append({
                "key": key, "suite": suite, "op": op,
                "params": {"batch": 8, "dtype_note": "bf16"}, "dtypes": {"x": "bfloat16"},
                "definition_hash": hashlib.sha256(f"{key}/{definition}".encode()).hexdigest()[:16],
                "samples_ns": samples_ns, "stats": stats, "flops": flops, "bytes": nbytes,
                "tflops": flops / stats["median"] / 1e3, "gbps": nbytes / stats["median"],
                "fraction_of_peak": {"compute": None, "memory": 0.1}})
        doc_runs.append({"index": index, "cases": cases})
    doc = {"schema_version": 1, "kind": results.KIND, "commit": commit,
           "created_with": {"version": "0.1.0", "build": {"compiler": "synthetic"}},
           "machine": machine(machine_name),
           "peaks": {"memory_gbps": 50.0, "tflops": {"float32": 1.5, "bfloat16": 3.0},
                     "source": "measured"},
           "mode": "hot", "runs": doc_runs}
    return results.validate(doc, "synthetic")


def write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


def validation(commit: str, *, step_ape: float = 0.08, noise: float = 0.03,
               ttft: float = -0.04, machine_name: str = "box", tp: int = 1) -> dict:
    """A `gnomon validate` document for ``commit`` (valid per gnomon.predict.accuracy), with
    the figures given and every noise floor `noise`."""
    from gnomon.predict import accuracy

    ape = {"count": 200, "median": step_ape, "p90": 2 * step_ape, "max": 3 * step_ape,
           "bias": 0.01}
    floor = {"count": 200, "median": noise, "p90": 2 * noise, "max": 3 * noise, "bias": 0.0}
    doc = {"schema_version": accuracy.SCHEMA_VERSION, "kind": accuracy.KIND, "commit": commit,
           "machine": machine(machine_name), "created_with": {"version": "0.1.0"},
           "setup": {"model": "small-llama", "predictor": "calibrated", "tp": tp,
                     "scale": 1.0},
           "step_ape": ape, "ttft_error": ttft, "tpot_error": 0.02, "throughput_error": -0.03,
           "noise_floor": {"step_ape": floor, "ttft_error": noise, "tpot_error": noise,
                           "throughput_error": noise}}
    return accuracy.validate(doc, "synthetic")
