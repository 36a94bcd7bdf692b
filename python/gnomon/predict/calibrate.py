"""`calibrate`: fit a `CalibratedPredictor` to this machine.

It runs a ``gnomon bench`` sweep (per-op rows), a sweep of the model's own GEMMs over M
(`gemm_sweep`) and a calibration workload through the real engine on a `VirtualClock`
(whole-step rows, and each step's op families as the runner timed them, `family_rows`), then
fits the predictor on all of them.

At ``tp > 1`` the engine runs tensor parallel, the sweep adds the ``comm`` suite, and all of it
runs with rank 0 on its share of the cores (`rank_threads`), as every worker rank is: the
predictor then prices a rank as it runs at that tp.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from gnomon.engine.engine_config import EngineConfig

from .calibrated import CalibratedPredictor
from .defaults import CALIBRATION_BENCH_SUITES, CALIBRATION_MODEL, CALIBRATION_REQUESTS
from .serve import RunTrace, run_workload, timed_engine
from .shapes import ModelSpec, StepShape
from .workloads import LengthDist, SyntheticSpec, synthetic

KV_BLOCKS = 4096  # 64k tokens: the sequence cap binds, not the cache


def calibration_engine(spec: ModelSpec, device: str = "cpu") -> EngineConfig:
    """The engine settings calibration and validation share, on `device`: a CPU-sized token
    budget, sequences of up to 2048 tokens (fewer where the model's positions end sooner), and
    a KV cache of `KV_BLOCKS`."""
    return EngineConfig(block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
                        max_model_len=min(2048, spec.config.max_position_embeddings),
                        num_kv_blocks=KV_BLOCKS, device=device)


def calibration_workload(spec: ModelSpec, num_requests: int = CALIBRATION_REQUESTS,
                         seed: int = 1):
    """Wide uniform lengths (prompts up to 5/8 and outputs up to 5/32 of the sequence limit)
    arriving faster than they are served, so the steps span prefill, decode and mixed batches
    up to the token budget and the sequence cap."""
    limit = calibration_engine(spec).max_model_len
    return synthetic(SyntheticSpec(num_requests=num_requests, rate=200.0,
                                   prompt_len=LengthDist.uniform(8, limit * 5 // 8),
                                   output_len=LengthDist.uniform(2, limit * 5 // 32),
                                   vocab_size=spec.config.vocab_size, seed=seed),
                     name="calibration")


@contextlib.contextmanager
def rank_threads(tp: int):
    """This process's torch threads set to one rank's share of the cores while `tp` ranks run
    (unchanged at tp 1), restored after."""
    import torch

    from gnomon.engine.distributed import threads_per_rank

    previous = torch.get_num_threads()
    if tp > 1:
        torch.set_num_threads(threads_per_rank(tp))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def measured_steps(trace: RunTrace, spec: ModelSpec,
                   tp: int = 1) -> Sequence[Tuple[StepShape, float]]:
    return [(StepShape.from_batch(s.batch, spec, tp=tp), s.seconds) for s in trace.steps]


def family_rows(trace: RunTrace, spec: ModelSpec, tp: int = 1):
    """Each step's op families on their own: ``(the family's ops, the seconds the real runner
    timed for it)``. A whole step's seconds cannot tell two terms that grow together apart
    (sampling and the per-sequence overhead both grow with the sequences that sample); its
    per-family times can."""
    from .calibrated import COMPUTE_FAMILIES
    from .opcount import step_ops

    rows = []
    for s in trace.steps:
        ops = step_ops(StepShape.from_batch(s.batch, spec, tp=tp))
        for family in COMPUTE_FAMILIES + ("communication",):
            seconds = s.breakdown.get(family, 0.0)
            mine = [op for op in ops if op.family == family]
            if seconds > 0 and mine:
                rows.append((mine, seconds))
    return rows


def real_run(model, workload, *, random_weights: bool = True,
             pace: Optional[RunTrace] = None, tp: int = 1, device: str = "cpu",
             progress: Optional[Callable[[int, int], None]] = None) -> RunTrace:
    """The workload through the real engine on `device` (`calibration_engine`, `tp` ranks),
    timed on a virtual clock (paced by an earlier run's step times when `pace` is given, to
    repeat its decisions)."""
    config = calibration_engine(ModelSpec.from_model(model), device).replace(
        tensor_parallel_size=tp)
    engine = timed_engine(model, config, random_weights=random_weights,
                          pace=None if pace is None else [s.seconds for s in pace.steps])
    try:
        return run_workload(engine, workload, progress=progress)
    finally:
        engine.close()


def gemm_sweep(spec: ModelSpec, max_m: int, repeats: int = 7, tp: int = 1,
               device: str = "cpu"):
    """The model's own GEMMs (`opcount.dense_ops`' gemm family: every layer's projections and
    lm_head; one rank's shard of them at `tp`), timed through ``torch.nn.functional.linear``
    on `device` as the runner calls them, at each knot M = 1, 2, 4, ... up to `max_m`:
    ``[(ops, seconds)]``, the median of `repeats` passes (on a GPU, from the first launch to
    the device's last finish). A pass walks every layer's own weights, as a step does, so they
    stream from memory rather than sit in a cache."""
    import torch
    import torch.nn.functional as F

    from .calibrated import GEMM_KNOTS
    from .opcount import dense_ops

    dtype = getattr(torch, spec.dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    out = []
    for m in (k for k in GEMM_KNOTS if k <= max_m):
        ops = [op for op in dense_ops(spec, m, m, tp) if op.family == "gemm"]
        calls = []
        for op in ops:
            n = round(op.flops / (2 * op.rows * op.depth * op.launches))
            x = torch.randn(m, op.depth, generator=g, dtype=dtype).to(device)
            calls += [(x, (torch.randn(n, op.depth, generator=g, dtype=dtype) * 0.02).to(device))
                      for _ in range(op.launches)]
        times = []
        with torch.inference_mode():
            for _ in range(repeats + 1):  # the first pass warms up
                sync()
                began = time.perf_counter()
                for x, w in calls:
                    F.linear(x, w)
                sync()
                times.append(time.perf_counter() - began)
        out.append((ops, float(np.median(times[1:]))))
    return out


def calibrate(model=CALIBRATION_MODEL, *, random_weights: bool = True,
              num_requests: int = CALIBRATION_REQUESTS, workload=None,
              bench_suites: Sequence[str] = CALIBRATION_BENCH_SUITES, bench_mode: str = "hot",
              bench_results: Sequence[dict] = (), tp: int = 1, device: str = "cpu",
              progress: Optional[Callable[[int, int], None]] = None) -> CalibratedPredictor:
    """Bench sweep (skipped when `bench_suites` is empty; at `tp` > 1 with the ``comm``
    suite) plus the calibration workload (default: `calibration_workload` of `num_requests`)
    through the real engine at `tp` on `device`; returns the fitted predictor."""
    from gnomon.bench.runner import run_bench
    from gnomon.engine.parallel import check_tp
    from gnomon.engine.runner import resolve_device

    spec = ModelSpec.from_model(model)
    check_tp(spec.config, tp, "tp")
    # a device this build cannot run on is refused before any work; the bench times the
    # current GPU (its devices are "cpu" and "cuda")
    kind = resolve_device(device).type
    suites = list(bench_suites) + (["comm"] if tp > 1 and "comm" not in bench_suites else [])
    docs = list(bench_results)
    with rank_threads(tp):
        if suites:
            # the sweep's document stays in memory, so it needs no commit of its own
            docs.append(run_bench(suites, device=kind, quick=True, mode=bench_mode,
                                  commit="0" * 40))
        workload = workload or calibration_workload(spec, num_requests)
        trace = real_run(model, workload, random_weights=random_weights, tp=tp, device=device,
                         progress=progress)
        timed = gemm_sweep(spec, calibration_engine(spec).max_num_batched_tokens, tp=tp,
                           device=device)
    # the scheduler it ran under (a simulation under this predictor takes it by default); the
    # KV cache it had is this machine's, not the simulated GPU's
    info = {"model": spec.name, "workload": workload.description, "tp": tp,
            "engine": calibration_engine(spec, device).replace(num_kv_blocks=None).to_json(),
            "bench": f"suites {','.join(suites) or 'none'} (quick, {bench_mode})",
            "machine": _machine(kind)}
    timed += family_rows(trace, spec, tp)
    return CalibratedPredictor.fit_from(measured_steps(trace, spec, tp), docs, info=info,
                                        timed_ops=timed)


def _machine(kind: str) -> dict:
    from gnomon.bench.machine import machine_info

    return machine_info(kind)
