"""`simulate`: a workload through the real scheduler on a simulated runner, as one report.

The defaults answer the question gnomon was built for: gpt-oss-120b on one MI355X under a chat
workload at 8 requests/s, predicted by the roofline.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Union

from gnomon.hardware import Hardware

from .calibrated import CalibratedPredictor
from .defaults import (DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_NUM_REQUESTS, DEFAULT_RATE,
                       DEFAULT_WORKLOAD, PREDICTOR_FORMS)
from .hardware import resolve_hardware
from .metrics import SLO, compute_metrics
from .report import build_report
from .roofline import RooflinePredictor
from .serve import EngineArgs, RunTrace, run_workload, simulated_engine
from .shapes import ModelSpec
from .table import TablePredictor
from .workloads import Workload, resolve



def make_predictor(spec: str, hardware: Union[str, Hardware]):
    """``"roofline"`` (on `hardware`), ``"calibrated:FILE"`` or ``"table:FILE"``."""
    if not isinstance(spec, str):
        raise TypeError(f"predictor: expected {PREDICTOR_FORMS}, got {type(spec).__name__}")
    kind, _, path = spec.partition(":")
    if kind == "roofline" and not path:
        return RooflinePredictor(hardware)
    if kind == "calibrated" and path:
        return CalibratedPredictor.load(path)
    if kind == "table" and path:
        return TablePredictor.load(path)
    raise ValueError(f"predictor: unknown {spec!r}; expected {PREDICTOR_FORMS}")


def limits_for(model: ModelSpec, predictor, hardware: Hardware) -> List[str]:
    """What the report cannot see, stated next to its figures."""
    out = []
    c = model.config
    if "sliding" in c.layer_types:
        out.append(f"{model.name}'s sliding-window layers are modelled with full KV (no hybrid "
                   f"allocator yet): the KV capacity is the engine's, smaller than an engine "
                   f"that keeps only {c.sliding_window} tokens on those layers")
    if isinstance(predictor, RooflinePredictor):
        out.append("roofline: datasheet peaks times default efficiencies (REFERENCE.md), "
                   "uniform expert routing, no engine overhead, no launch gaps beyond a fixed "
                   f"{predictor.efficiencies.launch_s * 1e6:g} µs per kernel")
    out.append("KV capacity: HBM x 0.9 minus the weights and an estimate of the activations "
               "(a real engine measures them with a profiling forward)")
    out.append("generated tokens are a fixed non-EOS id; every request runs to its "
               "workload output length (ignore_eos)")
    out.append(f"hardware {hardware.name}: {hardware.bf16_tflops.source}")
    return out


def simulate(model: Union[str, os.PathLike, ModelSpec] = DEFAULT_MODEL,
             hardware: Union[str, Hardware] = DEFAULT_HARDWARE,
             workload: Union[str, Workload] = DEFAULT_WORKLOAD, *,
             rate: Optional[float] = DEFAULT_RATE,
             num_requests: Optional[int] = DEFAULT_NUM_REQUESTS,
             predictor="roofline", tp: int = 1, args: Optional[EngineArgs] = None,
             slo: Optional[SLO] = None, seed: int = 0,
             progress: Optional[Callable[[int, int], None]] = None):
    """Run the simulation; returns ``(report, trace)``. `args` default: the scheduler settings
    a calibrated predictor was calibrated under (its domain), else `EngineArgs()`."""
    spec = model if isinstance(model, ModelSpec) else ModelSpec.from_model(model)
    hw = resolve_hardware(hardware)
    pred = make_predictor(predictor, hw) if isinstance(predictor, str) else predictor
    if args is None:
        calibrated_under = getattr(pred, "info", {}).get("engine")
        args = EngineArgs(**calibrated_under) if calibrated_under else EngineArgs()
    synthetic_rate = None  # a trace or a given Workload carries its own arrivals
    if isinstance(workload, str):
        synthetic_rate = None if workload.startswith("trace:") else rate
        workload = resolve(workload, num_requests=num_requests, rate=synthetic_rate,
                           vocab_size=spec.config.vocab_size, seed=seed)
    engine = simulated_engine(spec, hw, pred, tp=tp, args=args)
    trace: RunTrace = run_workload(engine, workload, progress=progress)
    setup = {"model": spec.name, "hardware": hw.name, "predictor": pred.name, "tp": tp,
             "workload": {"name": workload.name, "description": workload.description,
                          "num_requests": workload.num_requests,
                          "rate": synthetic_rate},
             "engine": {**args.kwargs(), "num_kv_blocks": trace.num_kv_blocks}}
    report = build_report(trace=trace, metrics=compute_metrics(trace, slo or SLO()), setup=setup,
                          limits=limits_for(spec, pred, hw))
    return report, trace
