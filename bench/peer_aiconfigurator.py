#!/usr/bin/env python3
"""Run NVIDIA AIConfigurator as a peer predictor on real measured serving rows.

Standalone benchmark script: it is not a test, gnomon never imports it, and it
does not import gnomon.  It needs its own interpreter with
``aiconfigurator==0.12.0`` and ``aiconfigurator-core==0.12.0`` from PyPI
(the versions this script was written against and run with)::

    /tmp/aic/bin/python bench/peer_aiconfigurator.py --out /tmp/aic_rows.jsonl \
        [--jobs N] [--limit N]

What it does
------------
Reads ``aiconfigurator_core/systems/silicon_sample.csv`` (the measured
TTFT/TPOT rows NVIDIA ships inside the installed ``aiconfigurator_core``
package, located via ``importlib.resources``), keeps every row with
``mode == "agg"`` and ``model_path`` in ``MODELS`` (3,182 rows in 0.12.0: 1,120 Llama and
gpt-oss ones, 580 Qwen3 ones (3 of them NVIDIA's NVFP4 Qwen3-32B), 764 DeepSeek-R1/V3 ones, 8 of
NVIDIA's NVFP4 DeepSeek checkpoints, 523 MiniMax-M2.5 and 187 Kimi-K2.5 ones; ``--models`` picks
some), and
calls ``aiconfigurator.cli.api.cli_estimate`` for each row: once with the
row's own quant labels and, only when that is refused for missing perf data of
the row's quant mode, once more with the quant modes left to the checkpoint
(see "Quant fallback" below).  Each result is written, as rows complete, as one
JSON line::

    {"id": ..., "ttft_ms": float, "tpot_ms": float, "backend_version_used": str,
     "quant_used": "row" | "checkpoint", "gemm_quant_used": str, "moe_quant_used": str | null,
     "seconds": float[, "refused_row": "<the row-label refusal>"]}
    {"id": ..., "refused": "<ExceptionType>: <message, one line>"[, "refused_checkpoint": "<...>"]}

``refused`` is written when ``cli_estimate`` raises (missing perf data,
unsupported quant mode, its out-of-memory verdict, ...) or returns no finite
positive TTFT/TPOT; it always holds the refusal with the row's own labels, and
``refused_checkpoint`` is added when the checkpoint retry was made and refused
too.  A row answered by the retry carries ``quant_used: "checkpoint"`` and the
first refusal as ``refused_row``.  ``gemm_quant_used`` / ``moe_quant_used`` are
the modes aiconfigurator reports it estimated with (its result's ``gemm`` /
``moe`` fields).  ``seconds`` is the wall time of the answering
``cli_estimate`` call (the first call in each worker also pays for loading the
perf database).  Rows run in parallel in ``--jobs`` spawned worker processes
(default: CPU count); ``--limit N`` runs only the first N selected rows, in CSV
order.

Speculative rows
----------------
The rows do not say that a launch drafted; gnomon's launch rules do (``silicon.json``:
InferenceMAX's DeepSeek-R1 MTP launches on TensorRT-LLM). ``--drafts ACCURACY.json`` runs only
the rows a ``gnomon accuracy --out`` document simulated with drafts, passing ``cli_estimate`` the
same drafts: ``nextn`` k and ``nextn_accepted`` (the accepted drafts per decode step, ``a + ... +
a^k`` for a draft acceptance rate a); their lines record both. ``--replace-in FILE`` then puts
them in place of FILE's lines of the same ids::

    /tmp/aic/bin/python bench/peer_aiconfigurator.py --drafts accuracy.json \
        --out /tmp/aic_drafts.jsonl --replace-in bench/data/aiconfigurator_0.12.0_rows.jsonl

Row-to-arguments mapping
------------------------
The installed wheels contain no code that reads ``silicon_sample.csv``; the
upstream repository does (``tools/accuracy_regression_testing/
predict_silicon_sample.py`` in github.com/ai-dynamo/aiconfigurator, the
layout that matches the 0.12 split packages).  This script mirrors that
tool's mapping exactly:

* ``model_path``, ``system_name=system``, ``mode``, ``backend_name=backend``,
  ``isl``, ``osl`` from the row;
* ``gemm_quant_mode`` / ``moe_quant_mode`` = the row's values, ``None`` when
  the cell is empty;
* ``kvcache_quant_mode``, ``fmha_quant_mode`` and ``comm_quant_mode`` are not
  passed (``None``: aiconfigurator infers them from the model checkpoint
  config and its perf data), and ``ctx_tokens`` is left at its default
  (``isl``) -- the upstream tool does the same;
* ``batch_size`` (the benchmark's concurrency), ``tp_size``, ``pp_size``,
  ``attention_dp_size``, ``moe_tp_size``, ``moe_ep_size`` are passed as ints
  when the cell is non-empty and otherwise left at ``cli_estimate``'s default;
* ``database_mode`` is left at its default (``SILICON``).

Backend version: the row's ``backend_version`` is used when aiconfigurator
ships perf data for it on that system/backend (i.e. it is in
``get_supported_databases()[system][backend]``); otherwise (or when the cell
is empty) the latest version it has, ``get_latest_database_version(system,
backend)`` -- what ``cli_estimate`` itself picks for ``backend_version=None``.
The upstream tool does the same fallback, but reactively, by catching the
load error.  0.12.0 ships only its "current"/"next" slot versions (trtllm
1.3.0rc20/1.3.0rc23, vllm 0.24.0/0.27.0, sglang 0.5.14/0.5.16 on
h100/h200/b200), none of which is a version in these rows, so every row runs
on the current slot; ``backend_version_used`` records it per row.

These arguments make each row's first call, the only one the upstream tool
makes.

Quant fallback (checkpoint quant modes)
---------------------------------------
The rows' quant labels do not always match the public checkpoint of the model.
The ``openai/gpt-oss-120b`` rows are labelled ``nvfp4`` (five H100 TensorRT-LLM
rows ``fp8``), while the public checkpoint holds MXFP4 experts (bf16 attention
/ dense weights). With those labels aiconfigurator refuses every gpt-oss row:
on H100/H200 it turns ``nvfp4`` into ``nvfp4_wo`` GEMMs and has no such data,
on B200 it has no ``nvfp4`` MoE data at gpt-oss's shape, and on H100 it has no
``fp8`` MoE data at that shape either. So, to give the peer its best answer on
rows whose label does not match the public checkpoint, a row refused with its
own labels is run a second time with ``gemm_quant_mode`` and ``moe_quant_mode``
left as ``None`` -- aiconfigurator then infers them from the model's checkpoint
config (for gpt-oss-120b: ``bfloat16`` GEMMs and ``w4a16_mxfp4`` MoE) --
everything else unchanged. The retry is made only when the first refusal is a
``PerfDataNotAvailableError`` whose message names the missing quant mode
(``perf data missing for quant 'Q'`` / ``... empty for quant 'Q'`` or
``MoE data missing for MoeKey { quant: "Q", ... }``) and ``Q`` is the row's
gemm or moe label or a variant aiconfigurator derived from it (``Q`` equal
to the label or starting with ``label_``, e.g. ``nvfp4_wo`` from ``nvfp4``).
Out-of-memory verdicts, misses of other ops or of quant modes the row did not
set, and every other refusal are final; so is a refusal of a row with no
gemm/moe labels (the retry would be the same call). ``quant_used`` records
which call answered. In 0.12.0 the retry is made for all 435 gpt-oss rows and
for no other row, and answers 272 of them; of the rest, 161 (TensorRT-LLM
rows) are refused again for missing ``w4a16_mxfp4`` MoE data at their
moe_tp/moe_ep split and 2 (H100 vLLM, tp=2) for out-of-memory.

Model configs (offline)
-----------------------
``cli_estimate`` reads a model's HF ``config.json`` (and optional
``hf_quant_config.json``) from the package's bundled ``model_configs`` when the
model is in ``DefaultHFModels``, else from a local directory of that name,
else it downloads it from huggingface.co.  Of the four models only
``openai/gpt-oss-120b`` is bundled, and the machine this was written for has
no network, so by default (``--no-stage-configs`` turns this off and lets
aiconfigurator download) the script stages local directories, named exactly
like the model ids, in a temp dir that the workers ``chdir`` into, so that the
``model_path`` string aiconfigurator sees is unchanged:

* ``meta-llama/Llama-3.1-70B``: the bundled ``meta-llama/Meta-Llama-3.1-70B``
  config verbatim (the same HF repository, renamed).
* ``meta-llama/Llama-3.1-8B-Instruct``: the bundled
  ``meta-llama/Meta-Llama-3.1-8B`` config with the Instruct model's
  ``eos_token_id`` list; the architecture is identical.
* ``nvidia/Llama-3.1-8B-Instruct-FP8``: the same 8B config plus the
  ``hf_quant_config.json`` of the bundled sibling
  ``nvidia/Llama-3.1-70B-Instruct-FP8`` (ModelOpt FP8 weights, FP8 KV cache).
  The real 8B file was not available offline; this only affects which KV /
  FMHA quant mode aiconfigurator infers for those 21 rows.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import importlib.resources
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import redirect_stdout

MODELS = (
    "openai/gpt-oss-120b",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "nvidia/Llama-3.1-8B-Instruct-FP8",
    "Qwen/Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4",
    "Qwen/Qwen3-235B-A22B-FP8",
    "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3",
    "nvidia/DeepSeek-R1-NVFP4",
    "nvidia/DeepSeek-V3.1-NVFP4",
    "MiniMaxAI/MiniMax-M2.5",
    "moonshotai/Kimi-K2.5",
)
PARALLEL_FIELDS = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
AGG_FIELDS = ("batch_size", *PARALLEL_FIELDS)

# model id -> (bundled config id, config.json overrides, bundled hf_quant_config id or None)
_LLAMA31_INSTRUCT_EOS = {"eos_token_id": [128001, 128008, 128009]}
STAGED_CONFIGS = {
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", {}, None),
    "meta-llama/Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B", _LLAMA31_INSTRUCT_EOS,
                                         None),
    "nvidia/Llama-3.1-8B-Instruct-FP8": (
        "meta-llama/Meta-Llama-3.1-8B",
        _LLAMA31_INSTRUCT_EOS,
        "nvidia/Llama-3.1-70B-Instruct-FP8",
    ),
}


def silicon_sample_path() -> str:
    return str(importlib.resources.files("aiconfigurator_core") / "systems" / "silicon_sample.csv")


def select_rows(models=MODELS) -> list[dict[str, str]]:
    with open(silicon_sample_path(), newline="") as f:
        return [r for r in csv.DictReader(f) if r["mode"] == "agg" and r["model_path"] in models]


def resolve_versions(rows: list[dict[str, str]]) -> dict[tuple[str, str, str], str]:
    """(system, backend, row version) -> version to query, per the docstring's rule."""
    from aiconfigurator_core.sdk.perf_database import (get_latest_database_version,
                                                       get_supported_databases)

    supported = get_supported_databases()
    out: dict[tuple[str, str, str], str] = {}
    for r in rows:
        key = (r["system"], r["backend"], r["backend_version"])
        if key in out:
            continue
        shipped = supported.get(r["system"], {}).get(r["backend"], [])
        if r["backend_version"] and r["backend_version"] in shipped:
            out[key] = r["backend_version"]
        else:
            latest = get_latest_database_version(system=r["system"], backend=r["backend"])
            # "" -> cli_estimate raises "No database found", recorded as refused
            out[key] = latest or ""
    return out


def stage_model_configs(root: str) -> list[str]:
    """Write local config dirs for models the package does not bundle (see docstring)."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    bundled = importlib.resources.files("aiconfigurator_core") / "model_configs"
    staged = []
    for model, (src, overrides, quant_src) in STAGED_CONFIGS.items():
        if model in DefaultHFModels:
            continue
        d = os.path.join(root, model)
        os.makedirs(d, exist_ok=True)
        cfg = json.loads((bundled / f"{src.replace('/', '--')}_config.json").read_text())
        cfg.update(overrides)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        if quant_src is not None:
            q = (bundled / f"{quant_src.replace('/', '--')}_hf_quant_config.json").read_text()
            with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
                f.write(q)
        staged.append(model)
    return staged


def estimate_args(row: dict[str, str], version: str) -> dict:
    """Mirror of upstream predict_silicon_sample._estimate_args (agg rows)."""
    return dict(
        model_path=row["model_path"],
        system_name=row["system"],
        mode=row["mode"],
        backend_name=row["backend"],
        backend_version=version or None,
        isl=int(row["isl"]),
        osl=int(row["osl"]),
        gemm_quant_mode=row["gemm_quant_mode"] or None,
        moe_quant_mode=row["moe_quant_mode"] or None,
        **{field: int(row[field]) for field in AGG_FIELDS if row.get(field)},
    )


def read_drafts(path: str) -> dict[str, dict]:
    """Row id -> ``{"nextn": k, "nextn_accepted": a + ... + a^k}`` for each answered row of a
    gnomon accuracy document whose ``engine_settings`` drafted (``num_speculative_tokens=k``,
    ``draft_acceptance_rate=a``)."""
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for row in doc["rows"]:
        if row["status"] != "answered":
            continue
        settings = dict(kv.split("=", 1) for kv in row["point"]["engine_settings"].split(";")
                        if kv)
        k = int(settings.get("num_speculative_tokens", 0))
        if k:
            a = float(settings.get("draft_acceptance_rate", 0))
            out[row["id"]] = {"nextn": k, "nextn_accepted": sum(a ** i for i in range(1, k + 1))}
    return out


def replace_lines(path: str, new_path: str) -> int:
    """Puts `new_path`'s JSON lines in place of `path`'s lines of the same ids (others kept,
    in order); how many it replaced."""
    with open(new_path) as f:
        new = {json.loads(line)["id"]: line for line in f if line.strip()}
    with open(path) as f:
        old = [line for line in f if line.strip()]
    done = 0
    with open(path, "w") as f:
        for line in old:
            rid = json.loads(line)["id"]
            if rid in new:
                line = new.pop(rid)
                done += 1
            f.write(line if line.endswith("\n") else line + "\n")
        for line in new.values():
            f.write(line if line.endswith("\n") else line + "\n")
    return done


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# The quant mode a PerfDataNotAvailableError names as missing: GEMM-style
# "perf data missing|empty for quant 'Q'" or the MoE key's `quant: "Q"`.
_MISSING_QUANT_RES = (
    re.compile(r"perf data (?:missing|empty) for quant '([^']+)'"),
    re.compile(r'MoE data missing for MoeKey \{ quant: "([^"]+)"'),
)


def is_quant_data_miss(exc: BaseException, args: dict) -> bool:
    """True when ``exc`` is a perf-data miss for the row's own gemm/moe quant mode."""
    if type(exc).__name__ != "PerfDataNotAvailableError":
        return False
    labels = {q for q in (args.get("gemm_quant_mode"), args.get("moe_quant_mode")) if q}
    msg = str(exc)
    for rx in _MISSING_QUANT_RES:
        for q in rx.findall(msg):
            if any(q == lab or q.startswith(lab + "_") for lab in labels):
                return True
    return False


def _worker_init(workdir: str | None, log_path: str) -> None:
    # aiconfigurator prints and logs a lot (Python and Rust); keep it out of the
    # terminal, in a side log, at the file-descriptor level.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if workdir is not None:
        os.chdir(workdir)
    import aiconfigurator.cli.api  # noqa: F401  (import once per worker)


def _call(args: dict) -> tuple[dict | None, BaseException | str | None]:
    """One cli_estimate call -> (answer fields, None) or (None, exception or no-answer text)."""
    from aiconfigurator.cli.api import cli_estimate

    t0 = time.perf_counter()
    try:
        with redirect_stdout(sys.stderr):
            result = cli_estimate(**args)
    except BaseException as e:  # noqa: BLE001 -- every failure is a refusal
        if isinstance(e, KeyboardInterrupt):
            raise
        return None, e
    seconds = time.perf_counter() - t0
    drafted = {k: args[k] for k in ("nextn", "nextn_accepted") if k in args}
    ttft = getattr(result, "ttft", None) if result is not None else None
    tpot = getattr(result, "tpot", None) if result is not None else None
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (ttft, tpot))
    if not ok:
        return None, f"NoAnswer: cli_estimate returned ttft={ttft!r} tpot={tpot!r}"
    raw = getattr(result, "raw", None) or {}
    return {
        "ttft_ms": float(ttft),
        "tpot_ms": float(tpot),
        "backend_version_used": str(getattr(result, "backend_version", None)
                                    or args["backend_version"]),
        "gemm_quant_used": raw.get("gemm"),
        "moe_quant_used": raw.get("moe"),
        "seconds": round(seconds, 4),
        **drafted,
    }, None


def _refusal_text(err: BaseException | str) -> str:
    if isinstance(err, BaseException):
        return _one_line(f"{type(err).__name__}: {err}")
    return _one_line(err)


def _run_row(task: tuple[str, dict]) -> dict:
    row_id, args = task
    answer, err = _call(args)
    if answer is not None:
        return {"id": row_id, **answer, "quant_used": "row"}
    refused = _refusal_text(err)
    if not (isinstance(err, BaseException) and is_quant_data_miss(err, args)):
        return {"id": row_id, "refused": refused}
    answer2, err2 = _call({**args, "gemm_quant_mode": None, "moe_quant_mode": None})
    if answer2 is not None:
        return {"id": row_id, **answer2, "quant_used": "checkpoint", "refused_row": refused}
    return {"id": row_id, "refused": refused, "refused_checkpoint": _refusal_text(err2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL output file (overwritten)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="worker processes (default: CPU count)")
    ap.add_argument("--limit", type=int, default=None, help="run only the first N selected rows")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated model_path values, a subset of MODELS (default: all)")
    ap.add_argument(
        "--no-stage-configs",
        action="store_true",
        help="do not stage local configs for unbundled models; let aiconfigurator download "
             "them from HF",
    )
    ap.add_argument("--log", default=None,
                    help="aiconfigurator's own stdout/stderr (default: OUT.log)")
    ap.add_argument("--drafts", default=None, metavar="ACCURACY.json",
                    help="run only the rows a gnomon accuracy document simulated with "
                         "speculative decoding, with the same drafts (see Speculative rows)")
    ap.add_argument("--replace-in", default=None, metavar="FILE",
                    help="then put these rows' lines in place of FILE's lines of the same ids")
    opts = ap.parse_args()

    out_path = os.path.abspath(opts.out)
    log_path = os.path.abspath(opts.log or out_path + ".log")
    aic_version = importlib.metadata.version("aiconfigurator")
    core_version = importlib.metadata.version("aiconfigurator-core")

    models = tuple(opts.models.split(","))
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"--models: {', '.join(unknown)} not in MODELS ({', '.join(MODELS)})")
    rows = select_rows(models)
    drafts = read_drafts(opts.drafts) if opts.drafts else None
    if drafts is not None:
        rows = [r for r in rows if r["id"] in drafts]
    n_selected = len(rows)
    if opts.limit is not None:
        rows = rows[: opts.limit]
    versions = resolve_versions(rows)
    tasks = [
        (r["id"], {**estimate_args(r, versions[(r["system"], r["backend"], r["backend_version"])]),
                   **(drafts or {}).get(r["id"], {})})
        for r in rows
    ]

    workdir = None
    if not opts.no_stage_configs:
        workdir = tempfile.mkdtemp(prefix="aic_model_configs_")
        staged = stage_model_configs(workdir)
    else:
        staged = []

    print(
        f"aiconfigurator {aic_version} / aiconfigurator-core {core_version}; "
        f"{len(tasks)} of {n_selected} selected rows from {silicon_sample_path()}; "
        f"jobs={opts.jobs}; "
        f"staged configs: {staged or 'none'}; log: {log_path}",
        file=sys.stderr,
        flush=True,
    )
    open(log_path, "w").close()

    t_start = time.perf_counter()
    n_ok = n_refused = n_ckpt = 0
    ctx = mp.get_context("spawn")
    try:
        with open(out_path, "w") as out, ctx.Pool(
            processes=max(1, opts.jobs), initializer=_worker_init, initargs=(workdir, log_path)
        ) as pool:
            for i, rec in enumerate(pool.imap_unordered(_run_row, tasks, chunksize=1), 1):
                out.write(json.dumps(rec) + "\n")
                out.flush()
                if "refused" in rec:
                    n_refused += 1
                else:
                    n_ok += 1
                    n_ckpt += rec["quant_used"] == "checkpoint"
                if i % 20 == 0 or i == len(tasks):
                    el = time.perf_counter() - t_start
                    print(
                        f"[{i}/{len(tasks)}] answered={n_ok} (checkpoint quant: {n_ckpt}) "
                        f"refused={n_refused} "
                        f"elapsed={el:.0f}s",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"done: {n_ok} answered ({n_ckpt} with checkpoint quant), {n_refused} refused "
        f"in {time.perf_counter() - t_start:.1f}s -> {out_path}",
        file=sys.stderr,
    )
    if opts.replace_in:
        n = replace_lines(opts.replace_in, out_path)
        print(f"replaced {n} lines of {opts.replace_in}", file=sys.stderr)


if __name__ == "__main__":
    main()
