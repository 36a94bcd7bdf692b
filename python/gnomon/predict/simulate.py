"""`simulate`: a workload through the real scheduler on a simulated runner, as one report.

The defaults answer the question gnomon was built for: gpt-oss-120b on one MI355X under a chat
workload at 8 requests/s, predicted by the roofline.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Callable, List, Mapping, Optional, Union

from gnomon.engine.models import simulation_only
from gnomon.hardware import Hardware

from .calibrated import CalibratedPredictor
from .defaults import (DEFAULT_ENGINE, DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_NUM_REQUESTS,
                       DEFAULT_RATE, DEFAULT_WORKLOAD, PREDICTOR_FORMS)
from .engines import KV_MEMORY, EngineOverhead, EngineProfile, resolve_engine
from .hardware import resolve_hardware
from .metrics import SLO, compute_metrics
from .report import build_report
from .roofline import RooflinePredictor
from .serve import EngineArgs, RunTrace, run_workload, simulated_engine
from .shapes import ModelSpec
from .table import TablePredictor
from .workloads import LengthDist, Workload, resolve


def make_predictor(spec: str, hardware: Union[str, Hardware],
                   overhead: Optional[EngineOverhead] = None):
    """``"roofline"`` (on `hardware`, with the engine's `overhead`), ``"calibrated:FILE"`` or
    ``"table:FILE"`` (which carry the host cost of the engine they measured)."""
    if not isinstance(spec, str):
        raise TypeError(f"predictor: expected {PREDICTOR_FORMS}, got {type(spec).__name__}")
    kind, _, path = spec.partition(":")
    if kind == "roofline" and not path:
        return RooflinePredictor(hardware, overhead=overhead)
    if kind == "calibrated" and path:
        return CalibratedPredictor.load(path)
    if kind == "table" and path:
        return TablePredictor.load(path)
    raise ValueError(f"predictor: unknown {spec!r}; expected {PREDICTOR_FORMS}")


def limits_for(model: ModelSpec, predictor, hardware: Hardware,
               engine: Optional[EngineProfile] = None, hybrid_kv: bool = True,
               ep: int = 1, dp: int = 1) -> List[str]:
    """What the report cannot see, stated next to its figures."""
    out = []
    c = model.config
    if ep > 1:
        out.append(f"expert parallelism over {ep} GPUs: each holds {c.num_experts // ep} "
                   f"experts; routing is taken as balanced (each computes 1/{ep} of the "
                   f"token-expert pairs, none waits for a busier one)"
                   + (", and the experts' outputs are summed by the all-reduce tensor-parallel "
                      "attention already makes" if dp == 1 else ""))
    if dp > 1:
        out.append(f"attention data parallelism: {dp} schedulers with their own requests and KV "
                   f"pools in lockstep, a request to the group with the fewest unfinished "
                   f"ones; a step lasts as long as the slowest group's, its routed experts "
                   f"seeing every group's tokens, dispatched and combined by two all-to-alls "
                   f"per MoE layer (gnomon.predict.data_parallel, gnomon.engine.cost)")
    if "sliding" in c.layer_types and not hybrid_kv:
        out.append(f"{model.name}'s sliding-window layers keep full KV (hybrid KV cache off): "
                   f"the KV capacity is smaller than an engine that keeps only "
                   f"{c.sliding_window} tokens on those layers")
    if c.mla is not None:
        out.append(f"attention: Multi-head Latent Attention, its KV cache the "
                   f"{c.mla.latent}-element latent per token per layer, replicated on every "
                   f"tensor-parallel GPU; absorbed decode and naive prefill "
                   f"(gnomon.engine.models.mla)")
    reason = simulation_only(c.architecture)
    if reason:
        out.append(f"{reason}: the simulation is ahead of the kernels")
    if model.quantized:
        out.append(f"weights {model.linear_dtype}, KV {model.kv_dtype or model.dtype}: the "
                   f"simulation is ahead of the kernels; gnomon's real engine has no kernel "
                   f"for them yet and refuses such a model")
        if model.expert_compute == "w4a16":
            out.append(f"INT4 routed experts ({model.experts_dtype}, groups of 32) run "
                       f"weight-only (w4a16) at {hardware.name}'s bf16 peak")
        if model.linear_compute != "bfloat16" and hardware.tflops(model.linear_compute) is None:
            out.append(f"{hardware.name} has no {model.linear_compute} math: the "
                       f"{model.linear_dtype} GEMMs run weight-only at its bf16 peak")
    if isinstance(predictor, RooflinePredictor):
        eff = predictor.efficiencies
        if eff.curves is None:
            out.append(f"roofline: {hardware.name} has no kernel-efficiency curves; flat "
                       f"efficiencies {dict(eff.compute)} of the peaks")
        else:
            if eff.curves.note:
                out.append(f"roofline: {eff.curves.note}")
            defaulted = sorted(n for n, cv in eff.curves.curves.items() if cv.default)
            if defaulted:
                out.append(f"roofline: no public measurement for the {eff.curves.generation} "
                           f"curves {', '.join(defaulted)}; stated defaults "
                           f"(gnomon/predict/data/efficiency.json names them)")
        out.append(f"roofline: uniform expert routing, {eff.launch_s * 1e6:g} µs per kernel "
                   f"launch, no CUDA graphs")
        if predictor.overhead is None:
            out.append("roofline: no engine overhead")
    elif engine is not None:
        out.append(f"engine {engine.name}: its scheduler defaults apply; its host overhead does "
                   f"not, since {predictor.name} carries the measured host cost of its own "
                   f"engine")
    out.append(f"KV capacity: {KV_MEMORY['total' if engine is None else engine.kv_memory]} "
               f"(a real engine measures what it uses with a profiling forward)")
    if engine is not None:
        path = engine.serving
        out.append(f"engine {engine.name}: TTFT adds its serving path outside the steps, "
                   f"{path.request_s * 1e3:g} ms + {path.per_prompt_token_s * 1e6:g} us per "
                   f"prompt token in, {path.response_s * 1e3:g} ms out"
                   + (", and one step of async-scheduling lag" if path.output_lag_steps
                      else "") + f" ({engine.sources.get('serving', 'no source given')})")
    out.append("generated tokens are a fixed non-EOS id; every request runs to its "
               "workload output length (ignore_eos)")
    out.append(f"hardware {hardware.name}: {hardware.bf16_tflops.source}")
    return out


def simulate(model: Union[str, os.PathLike, ModelSpec] = DEFAULT_MODEL,
             hardware: Union[str, Hardware] = DEFAULT_HARDWARE,
             workload: Union[str, Workload] = DEFAULT_WORKLOAD, *,
             rate: Optional[float] = DEFAULT_RATE,
             num_requests: Optional[int] = DEFAULT_NUM_REQUESTS,
             predictor="roofline", tp: int = 1, ep: int = 1, dp: int = 1,
             args: Optional[EngineArgs] = None,
             engine: Union[str, EngineProfile] = DEFAULT_ENGINE,
             concurrency: Optional[int] = None, input_len: Optional[LengthDist] = None,
             output_len: Optional[LengthDist] = None, max_num_seqs: Optional[int] = None,
             max_num_batched_tokens: Optional[int] = None, weight_dtype: str = "auto",
             kv_dtype: str = "auto", slo: Optional[SLO] = None, seed: int = 0,
             enable_hybrid_kv: bool = True, engine_settings: Optional[Mapping] = None,
             progress: Optional[Callable[[int, int], None]] = None):
    """Run the simulation; returns ``(report, trace)``.

    `engine` (a profile name or file, `gnomon.predict.engines`) gives the scheduler defaults on
    this GPU and the host overhead the roofline adds; `engine_settings` (`EngineArgs` fields: the
    settings a server was launched with) and `max_num_seqs` and `max_num_batched_tokens` override
    the first. `args` replaces all of the scheduler's knobs;
    by default a calibrated predictor runs under the ones it was calibrated with (its domain).
    `concurrency` caps the requests in flight (`run_workload`); `input_len` / `output_len`
    replace a synthetic workload's lengths; `weight_dtype` / `kv_dtype` ("auto", "bfloat16",
    "fp8") override what the model's config declares. `enable_hybrid_kv` False keeps full KV on
    sliding-window layers (`gnomon.engine.kv_cache`), unless `args` says. `dp` runs attention
    data-parallel over that many groups of `tp` GPUs (`gnomon.predict.data_parallel`); `ep`
    splits the routed experts over that many of the ``tp x dp`` GPUs
    (`gnomon.engine.parallel.check_ep`)."""
    spec = model if isinstance(model, ModelSpec) else ModelSpec.from_model(
        model, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    hw = resolve_hardware(hardware)
    profile = resolve_engine(engine)
    pred = (make_predictor(predictor, hw, profile.overhead) if isinstance(predictor, str)
            else predictor)
    if args is not None and (max_num_seqs, max_num_batched_tokens, engine_settings) != (
            None, None, None):
        raise ValueError("max_num_seqs, max_num_batched_tokens, engine_settings: pass them in "
                         "args, which replaces every scheduler knob, or leave args None")
    if args is None:
        calibrated_under = getattr(pred, "info", {}).get("engine")
        knobs = dict(calibrated_under) if calibrated_under else profile.scheduler_defaults(hw)
        settings = dict(engine_settings or {})
        unknown = set(settings) - set(EngineArgs.__dataclass_fields__)
        if unknown:
            raise ValueError(f"engine_settings: unknown {sorted(unknown)}; expected fields of "
                             f"EngineArgs: {', '.join(EngineArgs.__dataclass_fields__)}")
        knobs.update(settings)
        for name, value in (("max_num_seqs", max_num_seqs),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name}: expected a positive int, got {value!r}")
                knobs[name] = value
        knobs["max_num_seqs"] = min(knobs["max_num_seqs"], knobs["max_num_batched_tokens"])
        knobs["enable_hybrid_kv"] = enable_hybrid_kv
        args = EngineArgs(**knobs)
    synthetic_rate = None  # a trace or a given Workload carries its own arrivals
    if isinstance(workload, str):
        synthetic_rate = None if workload.startswith("trace:") else rate
        workload = resolve(workload, num_requests=num_requests, rate=synthetic_rate,
                           vocab_size=spec.config.vocab_size, seed=seed, input_len=input_len,
                           output_len=output_len)
    sim = simulated_engine(spec, hw, pred, tp=tp, ep=ep, dp=dp, args=args,
                           gpu_memory_utilization=profile.gpu_memory_utilization,
                           kv_memory=profile.kv_memory)
    trace: RunTrace = run_workload(sim, workload, concurrency=concurrency,
                                   serving=profile.serving, progress=progress)
    rate_shown = "inf" if synthetic_rate is not None and math.isinf(synthetic_rate) \
        else synthetic_rate
    setup = {"model": spec.name, "hardware": hw.name, "predictor": pred.name, "tp": tp, "ep": ep,
             "dp": dp,
             "dtypes": {"activations": spec.dtype, "weights": spec.linear_dtype,
                        "experts": spec.experts_dtype,
                        "kv_cache": spec.kv_dtype or spec.dtype},
             "workload": {"name": workload.name, "description": workload.description,
                          "num_requests": workload.num_requests, "rate": rate_shown,
                          "concurrency": concurrency},
             "engine": {"profile": profile.name, "description": profile.description,
                        **args.kwargs(), "num_kv_blocks": trace.num_kv_blocks,
                        "gpu_memory_utilization": profile.gpu_memory_utilization,
                        "kv_memory": profile.kv_memory,
                        "kv_capacity_tokens": trace.num_kv_blocks * args.block_size,
                        "overhead": (asdict(profile.overhead)
                                     if isinstance(pred, RooflinePredictor) else None),
                        "serving": asdict(profile.serving),
                        **({"attention_dp_balance": asdict(args.balance())} if dp > 1
                           else {})}}
    report = build_report(trace=trace,
                          metrics=compute_metrics(trace, slo or SLO(), num_gpus=tp * dp),
                          setup=setup,
                          limits=limits_for(spec, pred, hw, profile, args.enable_hybrid_kv, ep,
                                            dp))
    return report, trace
