"""The measurements behind `bench/test_step_scale.py`, each run in a fresh interpreter.

``python bench/step_scale_cases.py CASE '{"arg": ...}'`` runs one case and prints one JSON
line: its figures, ``wall_s`` (the whole process), ``import_s`` and the process's peak RSS.
A fresh process gives each case a clean peak RSS, and lets the same case run against another
install of gnomon (the baseline) by running this file with that install's interpreter. The
cases use only APIs that the previous contract had too (the CLI, `LLMEngine`, `ModelRunner`'s
``prepare``), so a baseline install can run them unchanged.

Cases:
- ``simulate``: ``gnomon simulate`` through its CLI entry with the given arguments (a trace
  file of fixed lengths is written for ``input_len`` / ``output_len`` / ``num_requests``).
- ``calls_per_token``: the same simulation under cProfile; Python function calls per
  generated token (a count, not a clock).
- ``startup``: ``gnomon simulate --help``, and the imports a simulation needs before its first
  step.
- ``engine_overhead``: the real engine's host work per decode step (schedule, input prep by the
  real `ModelRunner.prepare`, update, outputs) with no forward: ``batch`` requests of
  ``context`` prompt tokens on a tiny model, the median over the steps that decode all of them.
"""

import json
import os
import resource
import sys
import tempfile
import time

BEGAN = time.perf_counter()


def _trace(num_requests: int, input_len: int, output_len: int) -> str:
    fd, path = tempfile.mkstemp(suffix=".csv", prefix="gnomon-step-scale-")
    with os.fdopen(fd, "w") as f:
        f.write("arrival_time,prompt_tokens,output_tokens\n")
        f.writelines(f"0,{input_len},{output_len}\n" for _ in range(num_requests))
    return path


def _simulate_argv(args: dict) -> list:
    argv = ["simulate"]
    trace = None
    if "input_len" in args:
        trace = _trace(args["num_requests"], args["input_len"], args["output_len"])
        argv += ["--workload", f"trace:{trace}"]
    elif "num_requests" in args:
        argv += ["--num-requests", str(args["num_requests"])]
    for flag in ("model", "hardware", "tp", "ep", "dp", "concurrency", "engine", "weight_dtype",
                 "kv_dtype"):
        if flag in args:
            argv += [f"--{flag.replace('_', '-')}", str(args[flag])]
    return argv, trace


def simulate(args: dict) -> dict:
    import contextlib
    import io

    from gnomon.cli import main

    argv, trace = _simulate_argv(args)
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    if trace:
        os.unlink(trace)
    return {"returncode": code, "simulate_s": time.perf_counter() - began}


def calls_per_token(args: dict) -> dict:
    import cProfile
    import contextlib
    import io
    import pstats

    from gnomon.cli import main

    argv, trace = _simulate_argv(args)
    profile = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        profile.runcall(main, argv)
    os.unlink(trace)
    calls = pstats.Stats(profile).total_calls
    tokens = args["num_requests"] * args["output_len"]
    return {"calls": calls, "tokens": tokens, "calls_per_token": calls / tokens}


def startup(args: dict) -> dict:
    import contextlib
    import io

    began = time.perf_counter()
    from gnomon.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(["simulate", "--help"])
        except SystemExit:
            pass
    help_s = time.perf_counter() - began
    # what a simulation imports before its first step
    import gnomon.predict.simulate  # noqa: F401
    import gnomon.engine.llm  # noqa: F401
    return {"help_s": help_s, "simulation_imports_s": time.perf_counter() - began,
            "torch_imported": "torch" in sys.modules}


def engine_overhead(args: dict) -> dict:
    import numpy as np

    from gnomon.engine.batch import StepOutput
    from gnomon.engine.config import ModelConfig, preset_json
    from gnomon.engine.llm import LLMEngine
    from gnomon.engine.runner import ModelRunner
    from gnomon.engine.sampling_params import SamplingParams
    from gnomon.engine.random_weights import random_weights

    batch, context, steps = args["batch"], args["context"], args["decode_steps"]
    raw = preset_json("tiny-llama")
    raw["max_position_embeddings"] = context + steps + 16
    config = ModelConfig.from_json(raw)
    import torch
    blocks = batch * (-(-(context + steps) // 16)) + 16
    model = ModelRunner(config, random_weights(config, torch.float32), num_kv_blocks=blocks,
                        block_size=16)

    class PrepareOnly:
        """The real runner's input prep and nothing after it (no forward, no sampling)."""

        def execute(self, b):
            if b.sequences:
                model.prepare(b)
            elif hasattr(model, "tables"):
                model.tables.apply(b)
            return StepOutput(tuple(3 if s.is_last_prefill_chunk else None for s in b.sequences))

    # every prompt in the first step, so all `batch` sequences then decode together
    engine = LLMEngine(config, runner=PrepareOnly(), num_kv_blocks=blocks, block_size=16,
                       max_num_seqs=batch, max_num_batched_tokens=batch * context,
                       enable_prefix_caching=True)
    rng = np.random.default_rng(0)
    for i in range(batch):
        engine.add_request(i, rng.integers(3, config.vocab_size, context).tolist(),
                           SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True))
    times = []
    while engine.has_unfinished_requests():
        began = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - began, engine.scheduler.num_running))
    decode = [t for t, running in times[1:] if running == batch]  # past the prefill step
    return {"step_us_median": float(np.median(decode)) * 1e6,
            "step_us_p90": float(np.percentile(decode, 90)) * 1e6,
            "decode_steps": len(decode), "batch": batch, "context": context}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: getrusage's maxrss would carry over the peak
    of the process that forked this one)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


CASES = {"simulate": simulate, "calls_per_token": calls_per_token, "startup": startup,
         "engine_overhead": engine_overhead}

if __name__ == "__main__":
    case, raw = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    result = CASES[case](raw)
    result.update(wall_s=time.perf_counter() - BEGAN, peak_rss_mb=peak_rss_mb())
    print(json.dumps(result))
