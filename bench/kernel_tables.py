"""Kernel figures for the roofline from aiconfigurator-core's measured kernel tables.

aiconfigurator-core (NVIDIA AIConfigurator, Apache-2.0) ships the per-GPU, per-engine kernel
latencies it measured, ``systems/data/<system>/<op>/<engine>/<version>/<op>_perf.parquet``.
This script reads two of them and prints their figures with the tables they come from: the
GEMMs' are ``best_gemm`` in ``gnomon/predict/data/efficiency.json``; the all-reduce's are not
used yet (the roofline's collectives take the stated 10 us and the datasheet bandwidth: priced
with these, TensorRT-LLM's fit-split TPOT improved and vLLM's got worse, so vLLM's decode steps
hold costs the op list does not have).

GEMMs (``gemm/*/*/gemm_perf.parquet``: m, n, k, gemm_dtype, kernel_source, latency in ms)
  ``best_gemm`` is the rate at the shape the curves are normalised to: the ``gemm`` curve (by
  M) is 1 at M = 8192 and ``gemm_k`` (by K) at K = 16384. Per system and math: the fraction of
  the dense peak each engine's table reaches at M = 8192, K = 16384, the median over N in
  [4096, 16384] (the layers' widths; a narrower N runs slower, which no curve models), and the
  median over the tables. FP8 pools the per-tensor (``fp8``) and block-scaled (``fp8_block``)
  tables; FP4 is ``nvfp4``.

All-reduce (``comm/<engine>/<version>/custom_allreduce_perf.parquet``: num_gpus, message_size
in bf16 elements, latency in ms; the CUDA-graph rows, as a decode step runs them)
  Each engine's newest table, over 2, 4 and 8 GPUs. ``latency_s``: the median time of a 16 KB
  all-reduce (the bandwidth term is nothing there). Then per payload the share of the
  per-direction link bandwidth the rest of the time moves the ring's bytes at,
  ``ring_bytes / (bandwidth * (time - latency_s))`` capped at 1, the median over the tables
  and GPU counts, at the median ring bytes one rank sends.

Needs pandas and pyarrow (a bench script, not a runtime dependency).

    python bench/kernel_tables.py [--system b200_sxm] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics

from gnomon.engine.cost import ring_bytes
from gnomon.predict.hardware import resolve_hardware

# aiconfigurator-core's systems with GEMM tables, by gnomon's name of the GPU (H200 and GB200 take
# H100's and B200's figures in efficiency.json: the same dies)
SYSTEMS = {"a100_sxm": "A100 SXM 80GB", "b200_sxm": "B200", "b300_sxm": "B300",
           "h100_sxm": "H100 SXM", "l40s": "L40S", "rtx_pro_6000_server": "RTX PRO 6000 Blackwell"}
MATH = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
REF_M, REF_K, N_RANGE = 8192, 16384, (4096, 16384)
ENGINES = ("vllm", "sglang", "trtllm")
SMALL_ELEMENTS = 8192  # 16 KB of bf16: the latency
PAYLOADS = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)  # bf16 elements


def _root() -> str:
    import aiconfigurator_core
    return os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems", "data")


def gemm_fractions(system: str) -> dict:
    """``{math: {"tables": {"engine version (gemm_dtype: kernels)": fraction}, "median": f}}``."""
    import pandas as pd

    hw = resolve_hardware(SYSTEMS[system])
    out: dict = {}
    for path in sorted(glob.glob(os.path.join(_root(), system, "gemm", "*", "*",
                                              "gemm_perf.parquet"))):
        engine, version = path.split(os.sep)[-3:-1]
        df = pd.read_parquet(path)
        ref = df[(df.m == REF_M) & (df.k == REF_K) & df.n.between(*N_RANGE)]
        for dtype, rows in ref.groupby("gemm_dtype"):
            math = MATH.get(dtype)
            peak = hw.tflops(math) if math else None
            if not peak or rows.empty:
                continue
            rates = 2.0 * rows.m * rows.n * rows.k / (rows.latency * 1e-3) / 1e12
            kernels = ", ".join(sorted(rows.kernel_source.unique()))
            out.setdefault(math, {"tables": {}})["tables"][
                f"{engine} {version} ({dtype}: {kernels})"] = round(
                float(rates.median()) / peak, 3)
    for entry in out.values():
        entry["median"] = round(statistics.median(entry["tables"].values()), 3)
    return out


def _newest(folder: str) -> str:
    """The newest version folder: release numbers compared as integers, names without them
    (nightlies) last."""
    def key(name):
        nums = re.findall(r"\d+", name)
        return (bool(nums), [int(n) for n in nums])
    return max(os.listdir(folder), key=key)


def allreduce(system: str):
    """``{"tables": [...], "latency_s": s, "points": [[ring bytes, share], ...]}``; None where
    no engine has a custom all-reduce table for `system` or it has no interconnect figure."""
    import pandas as pd

    gbps = resolve_hardware(SYSTEMS[system]).interconnect_gbps.value
    tables = {}
    for engine in ENGINES:
        folder = os.path.join(_root(), system, "comm", engine)
        version = _newest(folder) if os.path.isdir(folder) else None
        path = os.path.join(folder, version or "", "custom_allreduce_perf.parquet")
        if not gbps or not os.path.isfile(path):
            continue
        df = pd.read_parquet(path)
        if "backend" in df:
            df = df[df.backend.str.endswith("graph")]
        tables[f"{engine} {version}"] = df
    if not tables:
        return None
    times = {}  # (table, gpus, elements) -> median seconds
    for name, df in tables.items():
        for (gpus, elements), rows in df.groupby(["num_gpus", "message_size"]):
            times[name, int(gpus), int(elements)] = float(rows.latency.median()) * 1e-3
    latency = statistics.median(t for (_, g, e), t in times.items()
                                if e == SMALL_ELEMENTS and g in (2, 4, 8))
    points = []
    for elements in PAYLOADS:
        xs, shares = [], []
        for (name, gpus, e), t in times.items():
            if e != elements or gpus not in (2, 4, 8):
                continue
            ring = ring_bytes("all_reduce", 2.0 * elements, gpus)
            xs.append(ring)
            shares.append(min(ring / (gbps * 1e9 * max(t - latency, 1e-12)), 1.0))
        points.append([round(statistics.median(xs)), round(statistics.median(shares), 3)])
    return {"tables": sorted(tables), "latency_s": round(latency, 8), "points": points}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", choices=sorted(SYSTEMS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {s: {"gemm": gemm_fractions(s), "allreduce": allreduce(s)}
              for s in (args.system or sorted(SYSTEMS))}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for system, figures in result.items():
        for math, entry in figures["gemm"].items():
            print(f"{system} GEMM {math}: median {entry['median']}")
            for label, frac in entry["tables"].items():
                print(f"    {frac:.3f}  {label}")
        ar = figures["allreduce"]
        if ar is None:
            continue
        print(f"{system} all-reduce ({'; '.join(ar['tables'])}): latency "
              f"{ar['latency_s'] * 1e6:.2f} us; share of the link by ring bytes {ar['points']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
