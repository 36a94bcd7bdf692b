"""`validate`: how well a held-out `CalibratedPredictor` predicts the real engine on this CPU.

1. Calibrate on the calibration workload and a bench sweep (`calibrate.calibrate`); the
   validation workload below is drawn from other distributions with another seed.
2. Run the validation workload for real twice (after a short warm-up run): the spread of
   TTFT, TPOT and throughput between the two is the machine's noise floor for those; and once
   more paced by the first run's step times (`TimedRunner`), so the very same batches are timed
   twice: the spread of their step times is the per-step noise floor.
3. Run it through `SimulatedRunner` with the calibrated predictor.
4. Per-step absolute percentage error of the predictor on every real step of the first run
   (its own shape, so the errors are the predictor's alone), split into prefill-only,
   decode-only and mixed steps; and the signed errors of the simulation's mean TTFT, mean TPOT
   and output throughput against the first real run.
5. The same per-step error up to one factor (``step_ape_rescaled``): the predictions divided by
   their median ratio to the measured steps (``factor``). Another process that starts or stops
   between the calibration and the real run scales every step's time; this figure is what is
   left of the error apart from that scale, so it holds on a busy machine where the plain one
   does not.
6. Beside them, with no goal (``roofline``): the same figures of the uncalibrated roofline of
   this hardware with gnomon's own host cost, what a machine never measured would be told.

On a GPU (``device`` ``cuda``) every real run, the bench sweep and the GEMM sweep run there,
the runner's breakdown by op family waits for the GPU at each charge (`TimedRunner`), and the
simulations price that GPU's hardware catalogue entry (`hardware.of_device`); on the CPU they
price this machine as measured (``host``).

Goal: step median APE <= 5% and TTFT, TPOT and throughput within 5%, or 1.5x the noise floor
where the noise floor exceeds 3.3%.

Both workloads are sized to the machine (`machine_scale`): on one too slow to run the full
ones in about two minutes, fewer requests arrive at a proportionally lower rate, so the load
against the machine's capacity stays the same.

At ``tp > 1`` the calibration, the real runs and the simulation are all tensor parallel, with
every rank on its share of the cores (`calibrate.rank_threads`), and the report adds the
``communication`` share of the real steps' busy seconds.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from gnomon import documents
from gnomon.engine.parallel import check_tp

from . import accuracy
from .accuracy import KIND, SCHEMA_VERSION
from .calibrate import calibrate, calibration_engine, measured_steps, rank_threads, real_run
from .calibrated import CalibratedPredictor
from .cost import PredictionRefused
from .defaults import CALIBRATION_BENCH_SUITES, CALIBRATION_MODEL, CALIBRATION_REQUESTS
from .engines import resolve_engine
from .hardware import of_device
from .metrics import compute_metrics
from .roofline import RooflinePredictor
from .serve import RunTrace, run_workload, simulated_engine
from .shapes import ModelSpec
from .workloads import LengthDist, SyntheticSpec, synthetic

GOAL = 0.05
NOISE_THRESHOLD = 0.033
NOISE_FACTOR = 1.5
VALIDATION_RATE = 25.0  # requests/s at full size (scale 1)
REAL_RUN_BUDGET_S = 20.0  # busy seconds one real run of the full-size workload may take
MIN_SCALE = 0.3  # below it the runs hold too few steps to tell error from noise


def machine_scale(warm_up: RunTrace, num_requests: int) -> float:
    """How much of the full-size workloads this machine runs within the budget: the warm-up's
    busy seconds per request, times `num_requests`, against `REAL_RUN_BUDGET_S` (1 on a machine
    fast enough, less on a slower one; at least `MIN_SCALE`)."""
    per_request = sum(s.seconds for s in warm_up.steps) / warm_up.workload.num_requests
    return max(MIN_SCALE, min(1.0, REAL_RUN_BUDGET_S / (per_request * num_requests)))


def validation_workload(spec: ModelSpec, num_requests: int = 120, seed: int = 7,
                        rate: float = VALIDATION_RATE):
    """Lognormal serving-like lengths at a moderate Poisson rate (another shape and seed than
    `calibrate.calibration_workload`): prompts of median 1/10 and at most 1/2 of the sequence
    limit, outputs of median 1/32 and at most 1/8."""
    limit = calibration_engine(spec).max_model_len
    return synthetic(SyntheticSpec(
        num_requests=num_requests, rate=rate,
        prompt_len=LengthDist.lognormal(limit // 10, 0.8, 16, limit // 2),
        output_len=LengthDist.lognormal(limit // 32, 0.7, 4, limit // 8),
        vocab_size=spec.config.vocab_size, seed=seed), name="validation")


def _ape_summary(errors: Sequence[float]) -> Dict[str, Optional[float]]:
    """median / p90 / max of |e| and the mean signed error (bias), as fractions."""
    e = np.asarray(errors, dtype=float)
    if e.size == 0:
        return {"count": 0, "median": None, "p90": None, "max": None, "bias": None}
    a = np.abs(e)
    return {"count": int(e.size), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "max": float(a.max()), "bias": float(e.mean())}


def step_errors(predictor, trace: RunTrace, spec: ModelSpec,
                tp: int = 1) -> Dict[str, List[float]]:
    """Signed relative errors of `predictor` on every step of `trace` (run at `tp`), by step
    kind."""
    out: Dict[str, List[float]] = {"all": [], "prefill": [], "decode": [], "mixed": []}
    for shape, seconds in measured_steps(trace, spec, tp):
        try:
            predicted = predictor.predict(shape).seconds
        except PredictionRefused as refused:
            raise PredictionRefused(f"the {predictor.name} predictor refused a validation step "
                                    f"({refused.reason})") from None
        e = (predicted - seconds) / seconds
        out["all"].append(e)
        out[shape.kind].append(e)
    return out


def rescaled(errors: Sequence[float]) -> Dict[str, Optional[float]]:
    """`_ape_summary` of signed errors after dividing the predictions by their median ratio to
    the measured times, which it reports as ``factor``."""
    ratios = 1.0 + np.asarray(errors, dtype=float)
    if ratios.size == 0:
        return {"factor": None, **_ape_summary([])}
    factor = float(np.median(ratios))
    return {"factor": factor, **_ape_summary(ratios / factor - 1.0)}


def _headline(metrics: dict) -> Dict[str, float]:
    return {"ttft": metrics["ttft"]["mean"], "tpot": metrics["tpot"]["mean"],
            "throughput": metrics["throughput"]["output_tokens_per_s"]}


def _signed(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
    """(a - b) / b per headline figure."""
    return {f"{k}_error": (a[k] - b[k]) / b[k] for k in b}


def noise_step_errors(first: RunTrace, repeat: RunTrace) -> List[float]:
    """Relative step-time differences between a real run and its paced repeat (the same
    batches, `TimedRunner`'s ``pace``)."""
    if [s.batch for s in first.steps] != [s.batch for s in repeat.steps]:
        raise RuntimeError("the paced repeat made other decisions than the run it repeats")
    return [(b.seconds - a.seconds) / a.seconds for a, b in zip(first.steps, repeat.steps)]


def validate(model=CALIBRATION_MODEL, *, num_requests: int = 120,
             calibration_requests: int = CALIBRATION_REQUESTS,
             bench_suites: Sequence[str] = CALIBRATION_BENCH_SUITES,
             scale: Optional[float] = None, tp: int = 1, device: str = "cpu",
             commit: Optional[str] = None,
             progress: Optional[Callable[[str], None]] = None) -> dict:
    """Runs the whole validation (module docstring) at `tp` ranks on `device` and returns the
    JSON-ready report (a `gnomon.predict.accuracy` document of `commit`, default: the
    checkout's). `scale` shrinks both workloads (None: `machine_scale` measures it from the
    warm-up)."""
    import gnomon
    from gnomon.bench.machine import machine_info, resolve_commit
    from gnomon.engine.runner import resolve_device

    say = progress or (lambda stage: None)
    commit = resolve_commit(commit)
    spec = ModelSpec.from_model(model)
    check_tp(spec.config, tp, "tp")
    kind = resolve_device(device).type  # refused before any work if this build cannot run on it
    hardware = of_device(device)
    with rank_threads(tp):
        # The first real run in a process runs slower (page faults, allocator growth, thread
        # pool start-up); a warm-up keeps that out of both the calibration and the validation.
        say("warm-up run")
        warm = real_run(model, validation_workload(
            spec, num_requests=max(num_requests // 8, 4), seed=99), tp=tp, device=device)
        if scale is None:
            scale = machine_scale(warm, num_requests)
        # A slower machine runs fewer requests at a proportionally lower rate: the same load
        # against its capacity, the same arrival window, and about the same wall time.
        n = max(round(num_requests * scale), 1)
        say(f"calibrating (bench sweep, GEMM sweep, calibration workload; scale {scale:.2f})")
        predictor: CalibratedPredictor = calibrate(
            model, bench_suites=bench_suites, tp=tp, device=device,
            num_requests=max(round(calibration_requests * scale), 1))
        workload = validation_workload(spec, num_requests=n,
                                       rate=VALIDATION_RATE * n / num_requests)
        say("real run 1")
        first = real_run(model, workload, tp=tp, device=device)
        say("real run 2")
        second = real_run(model, workload, tp=tp, device=device)
        say("real run 1 repeated step for step")
        repeat = real_run(model, workload, pace=first, tp=tp, device=device)
    say("simulated runs")
    config = calibration_engine(spec, device).replace(tensor_parallel_size=tp)
    simulated = run_workload(simulated_engine(spec, hardware, predictor, config), workload)
    real_metrics, second_metrics = compute_metrics(first), compute_metrics(second)
    sim_metrics = compute_metrics(simulated)
    errors = step_errors(predictor, first, spec, tp)
    step_ape = _ape_summary(errors["all"])
    report = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "commit": commit,
        "machine": machine_info(kind),
        "created_with": {"version": gnomon.__version__},
        "setup": {"model": spec.name, "predictor": predictor.name,
                  "calibration": predictor.info, "workload": workload.description,
                  "scale": scale, "tp": tp, "hardware": hardware.name,
                  "engine": config.to_json()},
        "step_ape": step_ape,
        "step_ape_by_kind": {k: _ape_summary(errors[k]) for k in ("prefill", "decode", "mixed")},
        "step_ape_rescaled": rescaled(errors["all"]),
        **_signed(_headline(sim_metrics), _headline(real_metrics)),
        "noise_floor": {"step_ape": _ape_summary(noise_step_errors(first, repeat)),
                        **_signed(_headline(second_metrics), _headline(real_metrics))},
        "real": _headline(real_metrics), "simulated": _headline(sim_metrics),
        "roofline": _roofline(spec, hardware, config, workload, first, real_metrics),
        # busy seconds by family: the real runner's timings (the scheduler's share is
        # "unattributed") against the calibrated predictor's split
        "breakdown_s": {name: {**m["steps"]["breakdown_s"],
                               "unattributed": m["steps"]["unattributed_s"]}
                        for name, m in (("real", real_metrics), ("simulated", sim_metrics))},
        # the real steps' busy seconds in collectives (rank 0's batch broadcast included)
        "communication_share": (real_metrics["steps"]["breakdown_s"].get("communication", 0.0)
                                / sum(s.seconds for s in first.steps)),
        "steps": {"real": len(first.steps), "simulated": len(simulated.steps)},
        "wall_seconds": {"real_run": first.wall_seconds, "simulated_run": simulated.wall_seconds},
    }
    report["goal"] = _goal(report)
    return report


def _roofline(spec: ModelSpec, hardware, config, workload, first: RunTrace,
              real_metrics: dict) -> dict:
    """The uncalibrated roofline of `hardware` with gnomon's own host cost on the same steps
    and workload (what a machine never measured would be told), or its refusal's reason."""
    roofline = RooflinePredictor(hardware, overhead=resolve_engine("gnomon").overhead)
    try:
        unfitted = compute_metrics(run_workload(
            simulated_engine(spec, hardware, roofline, config), workload))
        errors = step_errors(roofline, first, spec, config.tensor_parallel_size)
    except PredictionRefused as refused:
        return {"predictor": roofline.name, "refused": refused.reason}
    return {"predictor": roofline.name, "step_ape": _ape_summary(errors["all"]),
            **_signed(_headline(unfitted), _headline(real_metrics)),
            "simulated": _headline(unfitted)}


def _goal(report: dict) -> dict:
    """Each figure's bound (5%, or 1.5x its noise floor where that exceeds 3.3%) and whether it
    was met."""
    noise = report["noise_floor"]
    rows = {"step_ape.median": (report["step_ape"]["median"], noise["step_ape"]["median"])}
    for k in ("ttft_error", "tpot_error", "throughput_error"):
        rows[k] = (report[k], noise[k])
    out = {}
    for name, (value, floor) in rows.items():
        floor = abs(floor) if floor is not None else 0.0
        bound = NOISE_FACTOR * floor if floor > NOISE_THRESHOLD else GOAL
        out[name] = {"value": value, "noise_floor": floor, "bound": bound,
                     "met": value is not None and abs(value) <= bound}
    return out


def dump(report: dict, path) -> None:
    documents.dump(accuracy.validate(report, str(path)), path)


def render(report: dict, console=None) -> None:
    """The validation as a `rich` table: each figure, its noise floor, its bound, met or not,
    then the per-step errors by step kind."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    setup = report["setup"]
    goal = Table(title=f"gnomon validate: {setup['predictor']} on {setup['model']}"
                       f"{' at tp ' + str(setup['tp']) if setup['tp'] > 1 else ''} "
                       f"(held-out workload)")
    for col in ("figure", "error", "noise floor", "bound", "met"):
        goal.add_column(col, justify="left" if col == "figure" else "right")
    for name, g in report["goal"].items():
        goal.add_row(name, pct(g["value"]), pct(g["noise_floor"]), f"{g['bound']:.1%}",
                     "yes" if g["met"] else "NO")
    console.print(goal)
    if setup["tp"] > 1:
        console.print(f"communication: {report['communication_share']:.1%} of the real steps' "
                      f"busy seconds")
    steps = Table(title="per-step absolute percentage error")
    for col in ("steps", "count", "median", "p90", "max", "bias"):
        steps.add_column(col, justify="left" if col == "steps" else "right")
    factor = report["step_ape_rescaled"]["factor"]
    rows = {"all": report["step_ape"], **report["step_ape_by_kind"],
            "all, rescaled" + (f" by {factor:.3f}" if factor else ""):
                report["step_ape_rescaled"],
            "noise floor": report["noise_floor"]["step_ape"]}
    for kind, s in rows.items():
        steps.add_row(kind, str(s["count"]), *(pct(s[k]) for k in ("median", "p90", "max",
                                                                     "bias")))
    console.print(steps)
    split = Table(title="busy seconds by op family, first real run against the simulation")
    for col in ("family", "real", "simulated"):
        split.add_column(col, justify="left" if col == "family" else "right")
    real, sim = report["breakdown_s"]["real"], report["breakdown_s"]["simulated"]
    for family in sorted(set(real) | set(sim)):
        split.add_row(family, *(f"{b.get(family, 0.0):.2f}" for b in (real, sim)))
    console.print(split)
    r = report["roofline"]
    console.print(f"uncalibrated {r['predictor']} on {setup['hardware']}: "
                  + (f"refused ({r['refused']})" if "refused" in r else
                     f"step error median {r['step_ape']['median']:.1%}; TTFT "
                     f"{pct(r['ttft_error'])}, TPOT {pct(r['tpot_error'])}, throughput "
                     f"{pct(r['throughput_error'])}"), highlight=False)
