"""Best-shape GEMM fractions of the dense peak from aiconfigurator-core's measured GEMM tables.

aiconfigurator-core (NVIDIA AIConfigurator, Apache-2.0) ships per-GPU, per-engine kernel
latency tables it measured: ``systems/data/<system>/gemm/<engine>/<version>/gemm_perf.parquet``
(columns m, n, k, gemm_dtype, kernel_source, latency in ms). `gnomon.predict.efficiency`'s
``best_gemm`` fraction is the rate at the shape its curves are normalised to: the ``gemm``
curve (by M) is 1 at M = 8192 and ``gemm_k`` (by K) is 1 at K = 16384. So this script reports,
per system and math, the fraction of the dense peak each engine's table reaches at M = 8192,
K = 16384, as the median over N in [4096, 16384] (the layers' widths; a narrower N runs
slower, which no curve models), and the median over the engines' tables. FP8 pools the
per-tensor (``fp8``) and block-scaled (``fp8_block``) tables; FP4 is ``nvfp4``.

Needs pandas and pyarrow (a bench script, not a runtime dependency).

    python bench/gemm_tables.py [--system b200_sxm] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics

from gnomon.predict.hardware import resolve_hardware

SYSTEMS = {"b200_sxm": "B200", "h100_sxm": "H100 SXM"}
MATH = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
REF_M, REF_K, N_RANGE = 8192, 16384, (4096, 16384)


def _root() -> str:
    import aiconfigurator_core
    return os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems", "data")


def fractions(system: str) -> dict:
    """``{math: {"tables": {"engine version (gemm_dtype)": fraction}, "median": fraction}}``."""
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
            label = f"{engine} {version} ({dtype}: {', '.join(sorted(rows.kernel_source.unique()))})"
            out.setdefault(math, {"tables": {}})["tables"][label] = round(
                float(rates.median()) / peak, 3)
    for entry in out.values():
        entry["median"] = round(statistics.median(entry["tables"].values()), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", choices=sorted(SYSTEMS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {s: fractions(s) for s in (args.system or sorted(SYSTEMS))}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for system, maths in result.items():
        for math, entry in maths.items():
            print(f"{system} {math}: median {entry['median']}")
            for label, frac in entry["tables"].items():
                print(f"    {frac:.3f}  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
