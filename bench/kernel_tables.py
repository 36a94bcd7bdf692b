"""Kernel figures for the roofline from aiconfigurator-core's measured kernel tables.

aiconfigurator-core (NVIDIA AIConfigurator, Apache-2.0) ships the per-GPU, per-engine kernel
latencies it measured, ``systems/data/<system>/<op>/<engine>/<version>/<op>_perf.parquet``.
This script reads two of them and prints the figures `gnomon.predict.efficiency` keeps in
``gnomon/predict/data/efficiency.json``, with the tables they come from (``--json``: all of it
as JSON under the GPUs' gnomon names, the ``allreduce`` entries as that file holds them).

GEMMs (``gemm/*/*/gemm_perf.parquet``: m, n, k, gemm_dtype, kernel_source, latency in ms)
  ``best_gemm`` is the rate at the shape the curves are normalised to: the ``gemm`` curve (by
  M) is 1 at M = 8192 and ``gemm_k`` (by K) at K = 16384. Per system and math: the fraction of
  the dense peak each engine's table reaches at M = 8192, K = 16384, the median over N in
  [4096, 16384] (the layers' widths; a narrower N runs slower, which no curve models), and the
  median over the tables. FP8 pools the per-tensor (``fp8``) and block-scaled (``fp8_block``)
  tables; FP4 is ``nvfp4``.

  ``curves`` (the generation's ``gemm`` and ``gemm_k`` in efficiency.json): per table (an
  engine's version and GEMM dtype), the rate at each M (K = 16384) and at each K (M = 8192),
  each the median over N in the same range, over its rate at the reference shape; then the
  median over the tables, capped at 1 (a curve is a factor of the reference shape's rate; the
  few points above it, 1.01 to 1.05 in B200's tables, lie within the tables' spread).

All-reduce (``comm/<engine>/<version>/custom_allreduce_perf.parquet``: num_gpus, message_size
in bf16 elements, latency in ms)
  ``allreduce``: each engine's newest table, its CUDA-graph rows where it has eager ones too
  (a decode step runs in a graph), over 2, 4 and 8 GPUs: the seconds of one all-reduce by its
  payload (2^10 to 2^27 elements, as bytes), or NCCL's (``comm/nccl/<version>/nccl_perf.
  parquet``, its newest, half precision) where that is faster: the engines send a payload past
  their custom kernel's range to NCCL (vLLM's and SGLang's ``CustomAllreduce.max_size``,
  TensorRT-LLM's AUTO strategy). A table holds one measurement per size, so a time is the least
  of its own and those of every larger payload (a larger all-reduce never takes less time; this
  drops the single slow outliers of small sizes).

Fused MoE (``moe/<engine>/<version>/moe_perf.parquet``: num_tokens, hidden_size, inter_size,
topk, num_experts, moe_tp_size, moe_ep_size, moe_dtype, distribution, latency in ms)
  ``moe``: per engine and math (the dtypes as gnomon prices them: ``fp8_block`` is fp8, or
  per-tensor ``fp8`` in a table without block-scaled rows: the FP8 MoE checkpoints gnomon
  serves, DeepSeek's, MiniMax's and Qwen3's, are block-scaled, and the two kernels' rates differ
  by up to 2x at prefill's token counts; ``nvfp4`` is fp4, ``int4_wo`` w4a16 (INT4 weights,
  bf16 activations: Kimi-K2.5's experts), ``w4a16_mxfp4`` w4a16_fp4 (MXFP4 weights run
  weight-only, as gpt-oss's on Hopper: another kernel, whose rate at prefill's token counts is
  not INT4's), ``w4a8_mxfp4_mxfp8`` w4a8), its newest table with such rows: the rows of balanced
  routing, no expert parallelism and moe_tp_size <= 8. Balanced routing touches
  ``min(num_tokens x topk, num_experts)`` experts of ``3 x hidden x inter / moe_tp`` weights
  each (gate, up and down), at the dtype's bits per weight (`MOE_BITS`), and runs ``2 x 3 x
  num_tokens x topk x hidden x inter / moe_tp`` FLOPs. Two fits, least squares on the relative
  error:
  - where the layer streams its expert weights (at most `MOE_TOKENS_PER_EXPERT` tokens per
    expert), ``seconds = floor_s + weight bytes / (memory x HBM peak)``;
  - on the other rows, with those two terms held, ``+ FLOPs / (compute x the math's dense
    peak)`` (`gnomon.predict.efficiency.MOE_PEAK`). At prefill's token counts a layer is neither
    memory- nor compute-bound (too few tokens per expert to fill the GEMM tiles), which the sum
    fits and the memory term alone misses by 25-60%. A compute fit the checks reject leaves the
    math's FLOPs to the grouped-GEMM curves.

Decode attention (``attention/<engine>/<version>/generation_attention_perf.parquet``:
batch_size, step (the tokens cached before), num_heads and num_key_value_heads per GPU,
head_dim, kv_cache_dtype, window_size, latency in ms)
  ``decode_attention``: per engine and KV cache dtype, its newest table: the rows of full
  attention with head dims 64 and 128, fitted in the same form with the KV bytes read,
  ``batch x (step + 1) x 2 x kv_heads x head_dim x bytes``.

A fit is kept where its floor is >= 0, its memory fraction (or the MoE's compute fraction) in
(0, 1] and its median error within `MAX_MEDIAN_ERROR`; the others are listed as rejected, with
the reason.
``includes`` in efficiency.json's ``decode_attention`` entries does not come from the tables:
it names the ops the collectors' timed call performs (read from aiconfigurator's
``collector/<engine>/collect_attn.py``) and is kept there by hand beside the fits.

Needs pandas, pyarrow and numpy (a bench script, not a runtime dependency).

    python bench/kernel_tables.py [--system b200_sxm] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics

from gnomon.predict.efficiency import MOE_PEAK
from gnomon.predict.hardware import resolve_hardware

# aiconfigurator-core's systems with GEMM tables, by gnomon's name of the GPU (H200 and GB200 take
# H100's and B200's figures in efficiency.json: the same dies)
SYSTEMS = {"a100_sxm": "A100 SXM 80GB", "b200_sxm": "B200", "b300_sxm": "B300",
           "h100_sxm": "H100 SXM", "l40s": "L40S", "rtx_pro_6000_server": "RTX PRO 6000 Blackwell"}
MATH = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
REF_M, REF_K, N_RANGE = 8192, 16384, (4096, 16384)
CURVE_M = (256, 512, 1024, 2048, 4096, 8192)
CURVE_K = (512, 1024, 1536, 2048, 3072, 4096, 8192, 16384)
ENGINES = ("vllm", "sglang", "trtllm")
GPU_COUNTS = (2, 4, 8)
# a table's MoE dtypes as the math gnomon prices them in, and their bits per weight (NVFP4: a
# scale byte per 16 codes; MXFP4: one per 32; INT4: a bf16 scale per 128)
MOE_MATH = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4",
            "w4a16_mxfp4": "w4a16_fp4", "int4_wo": "w4a16", "w4a8_mxfp4_mxfp8": "w4a8"}
MOE_BITS = {"bfloat16": 16.0, "fp8": 8.0, "fp8_block": 8.0, "nvfp4": 4.5, "w4a16_mxfp4": 4.25,
            "int4_wo": 4.125, "w4a8_mxfp4_mxfp8": 4.25}
MOE_TOKENS_PER_EXPERT = 8
MOE_MAX_TP = 8
ATTENTION_BYTES = {"bfloat16": 2, "fp8": 1}  # a KV cache dtype's bytes per element
MAX_MEDIAN_ERROR = 0.25
PAYLOADS = tuple(1 << e for e in range(10, 28))  # bf16 elements


def _root() -> str:
    import aiconfigurator_core
    return os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems", "data")


def _gemm_tables(system: str):
    """``(engine, version, gemm_dtype, rows)`` for every GEMM table of `system` whose dtype
    gnomon prices, its rows those with N in `N_RANGE`."""
    import pandas as pd

    for path in sorted(glob.glob(os.path.join(_root(), system, "gemm", "*", "*",
                                              "gemm_perf.parquet"))):
        engine, version = path.split(os.sep)[-3:-1]
        df = pd.read_parquet(path)
        for dtype, rows in df[df.n.between(*N_RANGE)].groupby("gemm_dtype"):
            if dtype in MATH:
                yield engine, version, dtype, rows


def gemm_fractions(system: str) -> dict:
    """``{math: {"tables": {"engine version (gemm_dtype: kernels)": fraction}, "median": f}}``."""
    hw = resolve_hardware(SYSTEMS[system])
    out: dict = {}
    for engine, version, dtype, rows in _gemm_tables(system):
        kind = MATH[dtype]
        peak = hw.tflops(kind)
        ref = rows[(rows.m == REF_M) & (rows.k == REF_K)]
        if not peak or ref.empty:
            continue
        rates = 2.0 * ref.m * ref.n * ref.k / (ref.latency * 1e-3) / 1e12
        kernels = ", ".join(sorted(ref.kernel_source.unique()))
        out.setdefault(kind, {"tables": {}})["tables"][
            f"{engine} {version} ({dtype}: {kernels})"] = round(float(rates.median()) / peak, 3)
    for entry in out.values():
        entry["median"] = round(statistics.median(entry["tables"].values()), 3)
    return out


def gemm_curves(system: str) -> dict:
    """``{"gemm": [[M, factor], ...], "gemm_k": [[K, factor], ...], "tables": [labels]}``:
    the shape curves of `system`'s GEMM tables (module docstring)."""
    def rate(rows, m, k):
        at = rows[(rows.m == m) & (rows.k == k)]
        return float((2.0 * at.m * at.n * at.k / at.latency).median()) if len(at) else None

    labels, by_m, by_k = [], {m: [] for m in CURVE_M}, {k: [] for k in CURVE_K}
    for engine, version, dtype, rows in _gemm_tables(system):
        ref = rate(rows, REF_M, REF_K)
        if not ref:
            continue
        labels.append(f"{engine} {version} {dtype}")
        for axis, points, at in ((by_m, CURVE_M, lambda x: (x, REF_K)),
                                 (by_k, CURVE_K, lambda x: (REF_M, x))):
            for x in points:
                r = rate(rows, *at(x))
                if r:
                    axis[x].append(r / ref)

    def curve(axis):
        return [[x, round(min(statistics.median(v), 1.0), 3)] for x, v in axis.items() if v]
    return {"gemm": curve(by_m), "gemm_k": curve(by_k), "tables": labels}


def _newest(folder: str) -> str:
    """The newest version folder: release numbers compared as integers, names without them
    (nightlies) last."""
    def key(name):
        nums = re.findall(r"\d+", name)
        return (bool(nums), [int(n) for n in nums])
    return max(os.listdir(folder), key=key)


def _allreduce_times(df) -> dict:
    """``{gpus: {elements: seconds}}`` of an all-reduce table's rows."""
    return {int(n): (rows.groupby("message_size").latency.median() * 1e-3).to_dict()
            for n, rows in df.groupby("num_gpus")}


def allreduce(system: str) -> dict:
    """``{engine: {"source": ..., "gpus": {"2": [[payload bytes, seconds], ...], ...}}}`` for
    every engine with a custom all-reduce table for `system`."""
    import pandas as pd

    nccl_folder = os.path.join(_root(), system, "comm", "nccl")
    nccl_version = _newest(nccl_folder) if os.path.isdir(nccl_folder) else None
    nccl = {}
    if nccl_version:
        df = pd.read_parquet(os.path.join(nccl_folder, nccl_version, "nccl_perf.parquet"))
        nccl = _allreduce_times(df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half")])
    out = {}
    for engine in ENGINES:
        folder = os.path.join(_root(), system, "comm", engine)
        version = _newest(folder) if os.path.isdir(folder) else None
        path = os.path.join(folder, version or "", "custom_allreduce_perf.parquet")
        if not os.path.isfile(path):
            continue
        df = pd.read_parquet(path)
        graph = "backend" in df and df.backend.str.endswith("graph").any()
        custom = _allreduce_times(df[df.backend.str.endswith("graph")] if graph else df)
        gpus = {}
        for n in GPU_COUNTS:
            times = custom.get(n, {})
            if not all(e in times for e in PAYLOADS):
                continue
            points, least = [], float("inf")
            for elements in reversed(PAYLOADS):
                least = min(least, times[elements], nccl.get(n, {}).get(elements, math.inf))
                points.append([2 * elements, float(f"{least:.3g}")])
            gpus[str(n)] = points[::-1]
        if gpus:
            out[engine] = {"source": (
                f"aiconfigurator-core 0.12.0's measured all-reduce (NVIDIA AIConfigurator, "
                f"Apache-2.0), bf16, read by bench/kernel_tables.py: the faster of the "
                f"engine's custom all-reduce (systems/data/{system}/comm/{engine}/{version}/"
                f"custom_allreduce_perf.parquet{', CUDA-graph rows' if graph else ''}) and "
                + (f"NCCL's (comm/nccl/{nccl_version}/nccl_perf.parquet)" if nccl else
                   "NCCL's (none measured here)")
                + ", as the engine sends a large payload to NCCL"),
                "gpus": gpus}
    return out


def _versions(folder: str, filename: str) -> list:
    """`folder`'s version folders holding `filename`, oldest first (as `_newest` orders them)."""
    if not os.path.isdir(folder):
        return []
    found = [v for v in os.listdir(folder) if os.path.isfile(os.path.join(folder, v, filename))]
    return sorted(found, key=lambda name: (bool(re.findall(r"\d+", name)),
                                           [int(n) for n in re.findall(r"\d+", name)]))


def _moe_rows(df):
    """A MoE table's rows (module docstring), each with the math gnomon prices it in, the bytes
    of the weights it reads, its FLOPs and whether it streams its weights (``streams``: at most
    `MOE_TOKENS_PER_EXPERT` tokens per expert)."""
    df = df.astype({c: float for c in ("num_tokens", "hidden_size", "inter_size", "topk",
                                        "num_experts", "moe_tp_size", "moe_ep_size")})
    df = df[(df.distribution == "balanced") & (df.moe_ep_size == 1)
            & (df.moe_tp_size <= MOE_MAX_TP) & df.moe_dtype.isin(list(MOE_MATH))]
    if (df.moe_dtype == "fp8_block").any():  # the block-scaled kernel, as the checkpoints run
        df = df[df.moe_dtype != "fp8"]
    pairs = df.num_tokens * df.topk
    width = df.hidden_size * df.inter_size / df.moe_tp_size
    return df.assign(math=df.moe_dtype.map(MOE_MATH), dtype=df.moe_dtype,
                     bytes=pairs.clip(upper=df.num_experts) * 3 * width
                     * df.moe_dtype.map(MOE_BITS).astype(float) / 8,
                     flops=2 * 3 * pairs * width,
                     streams=pairs <= MOE_TOKENS_PER_EXPERT * df.num_experts)


def _attention_rows(df):
    """A decode-attention table's rows of full attention with head dims 64 and 128 (MLA's
    latent heads are another kernel), each with its KV cache dtype and the KV bytes it reads:
    ``batch x (step + 1)`` tokens of K and V."""
    if "window_size" not in df:  # older tables: full attention only
        df = df.assign(window_size=0)
    df = df.astype({c: float for c in ("batch_size", "step", "num_key_value_heads", "head_dim",
                                        "window_size")})
    df = df[(df.window_size == 0) & df.head_dim.isin([64, 128])
            & df.kv_cache_dtype.isin(list(ATTENTION_BYTES))]
    return df.assign(math=df.kv_cache_dtype, dtype=df.kv_cache_dtype,
                     bytes=df.batch_size * (df.step + 1) * 2 * df.num_key_value_heads
                     * df.head_dim * df.kv_cache_dtype.map(ATTENTION_BYTES).astype(float))


FITTED = {  # kind: (the op's folder, its table, the rows a fit takes)
    "moe": ("moe", "moe_perf.parquet", _moe_rows),
    "decode_attention": ("attention", "generation_attention_perf.parquet", _attention_rows),
}


def _fit_stream(rows, peak):
    """``(floor_s, memory)`` of ``seconds = floor_s + bytes / (memory x peak)`` over `rows`,
    least squares on the relative error."""
    import numpy as np

    seconds = rows.latency.to_numpy(float) * 1e-3
    moved = rows.bytes.to_numpy(float)
    (floor, per_byte), *_ = np.linalg.lstsq(np.stack([1 / seconds, moved / seconds], 1),
                                            np.ones(len(seconds)), rcond=None)
    memory = 1 / per_byte / peak if per_byte > 0 else math.inf
    return floor, memory


def _fit_flops(rows, floor, memory, hbm, flops_peak):
    """The compute fraction of ``seconds = floor_s + bytes / (memory x HBM peak) + FLOPs /
    (compute x flops_peak)`` over `rows` with the first two terms held (least squares on the
    relative error), or inf where the FLOPs take no time of their own."""
    import numpy as np

    seconds = rows.latency.to_numpy(float) * 1e-3
    rest = 1 - (floor + rows.bytes.to_numpy(float) / (memory * hbm)) / seconds
    x = rows.flops.to_numpy(float) / seconds
    per_flop = float(np.dot(x, rest) / np.dot(x, x))
    return 1 / per_flop / flops_peak if per_flop > 0 else math.inf


def _errors(rows, floor, memory, hbm, compute=None, flops_peak=None):
    """The median and 90th percentile of the fit's relative error over `rows`."""
    import numpy as np

    predicted = floor + rows.bytes.to_numpy(float) / (memory * hbm)
    if compute:
        predicted = predicted + rows.flops.to_numpy(float) / (compute * flops_peak)
    error = np.abs(predicted / (rows.latency.to_numpy(float) * 1e-3) - 1)
    return round(float(np.median(error)), 3), round(float(np.quantile(error, 0.9)), 3)


def fitted(system: str, kind: str) -> dict:
    """``{engine: {"maths": {math: {"floor_s", "memory", "rows", "median_error", "p90_error",
    ["compute", "compute_rows", "compute_median_error", "compute_p90_error",] "table"}},
    "rejected": {math: reason}}}``: each engine's `kind` kernel on `system` fitted as ``seconds
    = floor_s + bytes / (memory x HBM peak)`` per math on the rows that stream their operands,
    then, for the MoE, ``+ FLOPs / (compute x the math's dense peak)`` on the rest (module
    docstring)."""
    import pandas as pd

    folder_name, filename, select = FITTED[kind]
    hw = resolve_hardware(SYSTEMS[system])
    hbm = hw.hbm_tbps.value * 1e12
    out = {}
    for engine in ENGINES:
        folder = os.path.join(_root(), system, folder_name, engine)
        tables = [(v, select(pd.read_parquet(os.path.join(folder, v, filename))))
                  for v in _versions(folder, filename)]
        maths, rejected = {}, {}
        for math_ in sorted({m for _, rows in tables for m in rows.math.unique()}):
            version, rows = [(v, r[r.math == math_]) for v, r in tables
                             if (r.math == math_).any()][-1]
            table = (f"systems/data/{system}/{folder_name}/{engine}/{version}/{filename} "
                     f"({'+'.join(sorted(rows.dtype.unique()))})")
            streams = rows[rows.streams] if "streams" in rows else rows
            floor, memory = _fit_stream(streams, hbm)
            fit = {"floor_s": float(f"{floor:.3g}"), "memory": round(float(memory), 3),
                   "rows": int(len(streams))}
            fit["median_error"], fit["p90_error"] = _errors(streams, floor, memory, hbm)
            if floor < 0 or not 0 < memory <= 1 or fit["median_error"] > MAX_MEDIAN_ERROR:
                rejected[math_] = (f"floor {floor * 1e6:.1f} us, memory {memory:.2f} of the HBM "
                                   f"peak, median error {fit['median_error']:.2f} over "
                                   f"{fit['rows']} rows of {table}")
                continue
            heavy = rows[~rows.streams] if "streams" in rows else rows.iloc[:0]
            if len(heavy):
                flops_peak = (hw.tflops(MOE_PEAK[math_]) or math.nan) * 1e12
                compute = _fit_flops(heavy, floor, memory, hbm, flops_peak)
                median, p90 = _errors(heavy, floor, memory, hbm, compute, flops_peak)
                if 0 < compute <= 1 and median <= MAX_MEDIAN_ERROR:
                    fit.update({"compute": round(float(compute), 3),
                                "compute_rows": int(len(heavy)),
                                "compute_median_error": median, "compute_p90_error": p90})
                else:  # the FLOPs stay with the grouped-GEMM curves
                    rejected[f"{math_} compute"] = (
                        f"compute {compute:.2f} of the dense peak, median error {median:.2f} "
                        f"over {len(heavy)} rows of {table}")
            maths[math_] = {**fit, "table": table}
        if maths or rejected:
            out[engine] = {"maths": maths, "rejected": rejected}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", choices=sorted(SYSTEMS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {SYSTEMS[s]: {"gemm": gemm_fractions(s), "curves": gemm_curves(s),
                           "allreduce": allreduce(s),
                           **{kind: fitted(s, kind) for kind in FITTED}}
              for s in (args.system or sorted(SYSTEMS))}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for gpu, figures in result.items():
        for kind, entry in figures["gemm"].items():
            print(f"{gpu} GEMM {kind}: median {entry['median']}")
            for label, frac in entry["tables"].items():
                print(f"    {frac:.3f}  {label}")
        curves = figures["curves"]
        for name in ("gemm", "gemm_k"):
            print(f"{gpu} {name} curve over {len(curves['tables'])} tables: "
                  + " ".join(f"{x}:{f}" for x, f in curves[name]))
        for engine, entry in figures["allreduce"].items():
            for gpus, points in entry["gpus"].items():
                print(f"{gpu} all-reduce {engine} over {gpus} GPUs, us at 2 KB .. 256 MB: "
                      + " ".join(f"{s * 1e6:.3g}" for _, s in points))
        for kind in FITTED:
            for engine, entry in figures[kind].items():
                for name, fit in entry["maths"].items():
                    print(f"{gpu} {kind} {engine} {name}: floor {fit['floor_s'] * 1e6:.1f} us, "
                          f"memory {fit['memory']} of the HBM peak; error median "
                          f"{fit['median_error']}, p90 {fit['p90_error']} over {fit['rows']} "
                          f"rows of {fit['table']}"
                          + (f"; compute {fit['compute']} of the dense peak, error median "
                             f"{fit['compute_median_error']}, p90 {fit['compute_p90_error']} "
                             f"over {fit['compute_rows']} rows" if "compute" in fit else ""))
                for name, reason in entry["rejected"].items():
                    print(f"{gpu} {kind} {engine} {name}: rejected ({reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
