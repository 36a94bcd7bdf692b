"""`simulate`: a `SimulationSpec`'s workload through the real scheduler on a simulated runner,
as one report.

The default spec answers the question gnomon was built for: gpt-oss-120b on one MI355X under a
chat workload at 8 requests/s, predicted by the roofline.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable, List, Mapping, Optional, Union

from gnomon.engine.engine_config import EngineConfig, check_fields
from gnomon.engine.models import simulation_only
from gnomon.hardware import Hardware

from .calibrated import CalibratedPredictor
from .defaults import PREDICTOR_FORMS
from .engines import KV_MEMORY, EngineOverhead, EngineProfile, resolve_engine
from .hardware import resolve_hardware
from .metrics import compute_metrics
from .report import build_report
from .roofline import RooflinePredictor
from .serve import RunTrace, run_workload, simulated_engine
from .shapes import ModelSpec
from .spec import SimulationSpec
from .table import TablePredictor
from .workloads import resolve


def make_predictor(spec: str, hardware: Union[str, Hardware],
                   overhead: Optional[EngineOverhead] = None, kernels: Optional[str] = None):
    """``"roofline"`` (on `hardware`, with the engine's `overhead` and its measured
    `kernels`), ``"calibrated:FILE"`` or ``"table:FILE"`` (which carry the host cost of the
    engine they measured)."""
    if not isinstance(spec, str):
        raise TypeError(f"predictor: expected {PREDICTOR_FORMS}, got {type(spec).__name__}")
    kind, _, path = spec.partition(":")
    if kind == "roofline" and not path:
        return RooflinePredictor(hardware, overhead=overhead, kernels=kernels)
    if kind == "calibrated" and path:
        return CalibratedPredictor.load(path)
    if kind == "table" and path:
        return TablePredictor.load(path)
    raise ValueError(f"predictor: unknown {spec!r}; expected {PREDICTOR_FORMS}")


def limits_for(model: ModelSpec, predictor, hardware: Hardware,
               engine: Optional[EngineProfile] = None,
               config: EngineConfig = EngineConfig()) -> List[str]:
    """What the report cannot see, stated next to its figures (`config`: the engine's
    resolved settings)."""
    out = []
    c = model.config
    hybrid_kv, ep, dp = (config.enable_hybrid_kv, config.expert_parallel_size,
                         config.data_parallel_size)
    k, a = config.num_speculative_tokens, config.draft_acceptance_rate
    if k:
        out.append(f"speculative decoding: {k} drafts per decode, each accepted with {a:g} when "
                   f"those before it were: {sum(a ** i for i in range(k + 1)):.2f} tokens per "
                   f"decode on average, drawn without randomness; the drafter is one more layer "
                   f"of {model.name}'s shape, run over the step's tokens and {k - 1} more "
                   f"time{'s' if k != 2 else ''} over one token per sequence, its weights and KV "
                   f"not counted in the memory (gnomon.predict.simulated)")
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
                   f"per MoE layer (gnomon.predict.data_parallel, gnomon.costing)")
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
    if model.expert_compute == "w4a8":
        out.append(f"MXFP4 routed experts run with MXFP8 activations at {hardware.name}'s fp8 "
                   f"peak" if hardware.tflops("fp4") else
                   f"MXFP4 routed experts run weight-only (w4a16) at {hardware.name}'s bf16 "
                   f"peak, without FP4 math")
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
        collectives = (f"ring traffic at the link bandwidth plus "
                       f"{eff.allreduce_latency_s * 1e6:g} µs each")
        if eff.allreduce is not None:
            gpus = ", ".join(str(n) for n in sorted(eff.allreduce.gpus))
            collectives = (f"all-reduces over {gpus} GPUs at {eff.allreduce.engine}'s measured "
                           f"times ({eff.allreduce.source}); the others {collectives}")
        out.append(f"roofline: collectives: {collectives}")
        if eff.moe is not None:
            out.append(f"roofline: MoE experts in {', '.join(sorted(eff.moe.maths))} at "
                       f"{eff.moe.engine}'s measured fused MoE ({eff.moe.source}); others at "
                       f"the grouped-GEMM curves")
        if predictor.overhead is None:
            out.append("roofline: no engine overhead")
        elif engine is not None and predictor.overhead.exposed_per_seq_s:
            out.append(f"engine {engine.name}: each step adds "
                       f"{predictor.overhead.exposed_per_seq_s * 1e6:g} us per running sequence "
                       f"that no overlap hides ("
                       f"{engine.sources.get('exposed_overhead', 'no source given')})")
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
                   + (", and it schedules a step ahead: a request that comes while a step "
                      "runs also waits for the step chosen to follow"
                      if path.schedule_ahead_steps else "")
                   + f" ({engine.sources.get('serving', 'no source given')})")
    out.append("generated tokens are a fixed non-EOS id; every request runs to its "
               "workload output length (ignore_eos)")
    out.append(f"hardware {hardware.name}: {hardware.bf16_tflops.source}")
    return out


def engine_config(profile: EngineProfile, hw: Hardware, predictor,
                  settings: Mapping[str, object]) -> EngineConfig:
    """The engine a simulation runs: `profile`'s settings on `hw`, the scheduler a calibrated
    `predictor` was calibrated under (its domain) over them, and `settings` (`EngineConfig`
    fields: what the server was launched with) over both. ``max_num_seqs`` is capped at
    ``max_num_batched_tokens``, as vLLM caps it; a KV size in blocks or bytes replaces the
    profile's ``gpu_memory_utilization``."""
    check_fields(settings, "engine_settings")
    calibrated_under = getattr(predictor, "info", {}).get("engine") or {}
    knobs = {**profile.settings(hw),
             **{k: v for k, v in calibrated_under.items() if v is not None}, **settings}
    if settings.get("num_kv_blocks") is not None or settings.get("kv_cache_bytes") is not None:
        knobs["gpu_memory_utilization"] = None
    knobs["max_num_seqs"] = min(knobs["max_num_seqs"], knobs["max_num_batched_tokens"])
    return EngineConfig.from_mapping(knobs, "engine_settings")


def simulate(spec: SimulationSpec = SimulationSpec(), *,
             progress: Optional[Callable[[int, int], None]] = None):
    """Run the simulation `spec` describes; returns ``(report, trace)``; ``progress(done,
    total)`` after each step.

    The engine (`engine_config`): its profile (`gnomon.predict.engines`) gives the scheduler
    defaults on this GPU, the host overhead the roofline adds and the serving path; a
    calibrated predictor runs by default under the scheduler it was calibrated with (its
    domain); the spec's ``engine_settings`` override both. ``data_parallel_size`` runs
    attention data-parallel over that many groups of ``tensor_parallel_size`` GPUs
    (`gnomon.predict.data_parallel`); ``expert_parallel_size`` splits the routed experts over
    that many of them (`gnomon.engine.parallel.check_ep`). The report embeds `spec`."""
    if not isinstance(spec, SimulationSpec):
        raise TypeError(f"spec: expected a SimulationSpec (SimulationSpec.of(**flags) builds "
                        f"one from gnomon simulate's flag names), got {type(spec).__name__}")
    model = ModelSpec.from_model(spec.model, weight_dtype=spec.weight_dtype,
                                 kv_dtype=spec.kv_dtype)
    hw = resolve_hardware(spec.hardware)
    profile = resolve_engine(spec.engine)
    pred = make_predictor(spec.predictor, hw, profile.overhead, profile.kernels)
    # the activations' dtype is the model's (ModelSpec); a simulated engine reads no device or seed
    config = engine_config(profile, hw, pred, spec.engine_settings).replace(dtype=model.dtype)
    tp, ep, dp = (config.tensor_parallel_size, config.expert_parallel_size,
                  config.data_parallel_size)
    w = spec.workload
    workload = resolve(w.name, num_requests=w.num_requests, rate=w.rate,
                       vocab_size=model.config.vocab_size, seed=spec.seed, input_len=w.input_len,
                       output_len=w.output_len)
    sim = simulated_engine(model, hw, pred, config, kv_memory=profile.kv_memory)
    trace: RunTrace = run_workload(sim, workload, concurrency=w.concurrency,
                                   serving=profile.serving, progress=progress)
    setup = {"model": model.name, "hardware": hw.name, "predictor": pred.name, "tp": tp,
             "ep": ep, "dp": dp,
             "dtypes": {"activations": model.dtype, "weights": model.linear_dtype,
                        "experts": model.experts_dtype,
                        "kv_cache": model.kv_dtype or model.dtype},
             "workload": {"name": workload.name, "description": workload.description,
                          "num_requests": workload.num_requests,
                          "rate": w.to_json()["rate"], "concurrency": w.concurrency},
             "engine": {"profile": profile.name, "description": profile.description,
                        **{k: v for k, v in config.to_json().items()
                           if k not in ("device", "seed")},
                        "num_kv_blocks": trace.num_kv_blocks,
                        "kv_memory": profile.kv_memory,
                        "kv_capacity_tokens": trace.num_kv_blocks * config.block_size,
                        "overhead": (asdict(profile.overhead)
                                     if isinstance(pred, RooflinePredictor) else None),
                        "serving": asdict(profile.serving)}}
    report = build_report(trace=trace,
                          metrics=compute_metrics(trace, spec.slo, num_gpus=tp * dp),
                          setup=setup,
                          limits=limits_for(model, pred, hw, profile, config),
                          spec=spec.to_json())
    return report, trace
