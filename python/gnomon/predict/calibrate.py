"""`calibrate`: fit a `CalibratedPredictor` to this machine.

It runs a ``gnomon bench`` sweep (per-op rows) and a calibration workload through the real
engine on a `VirtualClock` (whole-step rows), then fits the predictor on both.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from .calibrated import CalibratedPredictor
from .defaults import CALIBRATION_BENCH_SUITES, CALIBRATION_MODEL, CALIBRATION_REQUESTS
from .serve import EngineArgs, RunTrace, run_workload, timed_engine
from .shapes import ModelSpec, StepShape
from .workloads import LengthDist, SyntheticSpec, synthetic

CPU_KV_BLOCKS = 4096  # 64k tokens: the sequence cap binds, not the cache


def cpu_engine_args(spec: ModelSpec) -> EngineArgs:
    """The scheduler settings calibration and validation share: a CPU-sized token budget and
    sequences of up to 2048 tokens (fewer where the model's positions end sooner)."""
    return EngineArgs(block_size=16, max_num_seqs=32, max_num_batched_tokens=512,
                      max_model_len=min(2048, spec.config.max_position_embeddings))


def calibration_workload(spec: ModelSpec, num_requests: int = CALIBRATION_REQUESTS,
                         seed: int = 1):
    """Wide uniform lengths (prompts up to 5/8 and outputs up to 5/32 of the sequence limit)
    arriving faster than they are served, so the steps span prefill, decode and mixed batches
    up to the token budget and the sequence cap."""
    limit = cpu_engine_args(spec).max_model_len
    return synthetic(SyntheticSpec(num_requests=num_requests, rate=200.0,
                                   prompt_len=LengthDist.uniform(8, limit * 5 // 8),
                                   output_len=LengthDist.uniform(2, limit * 5 // 32),
                                   vocab_size=spec.config.vocab_size, seed=seed),
                     name="calibration")


def measured_steps(trace: RunTrace, spec: ModelSpec) -> Sequence[Tuple[StepShape, float]]:
    return [(StepShape.from_batch(s.batch, spec), s.seconds) for s in trace.steps]


def real_run(model, workload, *, args: Optional[EngineArgs] = None,
             num_kv_blocks: int = CPU_KV_BLOCKS, random_weights: bool = True,
             pace: Optional[RunTrace] = None,
             progress: Optional[Callable[[int, int], None]] = None) -> RunTrace:
    """The workload through the real engine on this CPU, timed on a virtual clock (paced by
    an earlier run's step times when `pace` is given, to repeat its decisions). `args`
    default: `cpu_engine_args`."""
    args = args or cpu_engine_args(ModelSpec.from_model(model))
    engine = timed_engine(model, random_weights=random_weights, args=args,
                          num_kv_blocks=num_kv_blocks,
                          pace=None if pace is None else [s.seconds for s in pace.steps])
    return run_workload(engine, workload, progress=progress)


def calibrate(model=CALIBRATION_MODEL, *, random_weights: bool = True,
              num_requests: int = CALIBRATION_REQUESTS, workload=None,
              bench_suites: Sequence[str] = CALIBRATION_BENCH_SUITES, bench_mode: str = "hot",
              bench_results: Sequence[dict] = (),
              progress: Optional[Callable[[int, int], None]] = None) -> CalibratedPredictor:
    """Bench sweep (skipped when `bench_suites` is empty) plus the calibration workload
    (default: `calibration_workload` of `num_requests`) through the real engine; returns the
    fitted predictor."""
    from gnomon.bench.runner import run_bench

    spec = ModelSpec.from_model(model)
    docs = list(bench_results)
    if bench_suites:
        # the sweep's document stays in memory, so it needs no commit of its own
        docs.append(run_bench(list(bench_suites), quick=True, mode=bench_mode,
                              commit="0" * 40))
    workload = workload or calibration_workload(spec, num_requests)
    trace = real_run(model, workload, random_weights=random_weights, progress=progress)
    info = {"model": spec.name, "workload": workload.description,
            "engine": cpu_engine_args(spec).kwargs(),
            "bench": f"suites {','.join(bench_suites) or 'none'} (quick, {bench_mode})",
            "machine": _machine()}
    return CalibratedPredictor.fit_from(measured_steps(trace, spec), docs, info=info)


def _machine() -> dict:
    from gnomon.bench.machine import machine_info

    return machine_info("cpu")
