"""The `gnomon` command. It parses arguments and prints; the work lives in the library."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from gnomon._extras import ENGINE_EXTRA

ENGINE_MODULES = ("torch", "safetensors", "tokenizers")  # what the engine extra installs


def build_summary() -> dict:
    from gnomon import _C

    info = _C.build_info()
    try:  # the thread count the kernels use follows torch's unless pinned
        from gnomon.ops import num_threads
    except ImportError:
        num_threads = _C.num_threads
    info["num_threads"] = num_threads()
    info["kernel_paths"] = _C.cpu_kernel_paths()
    from gnomon import _compiled

    info["compiled_modules"] = _compiled.compiled_modules()
    info["pure_python"] = _compiled.pure_python()
    return info


def _print_info(as_json: bool) -> None:
    info = build_summary()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    sanitizers = ", ".join(info["sanitizers"]) or "none"
    print(f"gnomon {info['version']}")
    print(f"compiler:     {info['compiler']}")
    print(f"build:        {info['build_type']} ({info['cxx_flags']}); sanitizers: {sanitizers}")
    print(f"simd:         compiled for {info['simd_compiled']}; "
          f"this cpu has {', '.join(info['simd_cpu']) or 'none detected'}")
    by_path = {}
    for op, path in info["kernel_paths"].items():
        by_path.setdefault(path, []).append(op)
    print("cpu kernels:  " + "; ".join(f"{', '.join(ops)}: {path}"
                                       for path, ops in by_path.items()))
    backends = ", ".join(info["gpu_backends"])
    gpus = f"{backends} for {info['gpu_architectures']}" if backends else "none (CPU-only build)"
    print(f"gpu backends: {gpus}")
    print(f"threads:      {info['num_threads']}")
    modules = info["compiled_modules"]
    loaded = ", ".join(name for name, yes in modules.items() if yes) or "none"
    pure = "; GNOMON_PURE_PYTHON=1 runs their .py" if info["pure_python"] else ""
    print(f"cython:       {loaded} (this build compiled {len(modules)} modules{pure})")


def _add_bench_parser(commands) -> None:
    bench = commands.add_parser(
        "bench", help="time gnomon's ops at model shapes and write a results file",
        description="Times every case of the chosen suites and writes a results JSON.")
    bench.add_argument("--suite", default=None,
                       help="comma-separated suites (attention, moe, mxfp4, norm; default all)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    bench.add_argument("--runs", default="1",
                       help="repeat the sweep N times, each run in a fresh process (a process's "
                            "state holds for all its runs, so runs sharing one are not "
                            "independent)")
    bench.add_argument("--quick", action="store_true", help="small shapes, short sampling")
    bench.add_argument("--mode", default="hot", help="hot (reuse inputs) or cold (default hot)")
    bench.add_argument("--out", default=None, help="results file (default bench-<commit12>.json)")
    bench.add_argument("--commit", default=None,
                       help="the git SHA measured, where there is no checkout to read it from")


def _run_bench(args) -> int:
    from rich.console import Console

    from gnomon.bench import report, runner

    try:
        options = runner.BenchOptions.from_cli(suite=args.suite, device=args.device,
                                               runs=args.runs, quick=args.quick,
                                               mode=args.mode, out=args.out, commit=args.commit)
        with report.progress_bar(Console(stderr=True)) as progress:
            bench = runner.run_isolated if options.runs > 1 else runner.run_bench
            doc = bench(options.suites, device=options.device, runs=options.runs,
                        quick=options.quick, mode=options.mode, commit=options.commit,
                        progress=progress)
        runner.write_results(doc, options.out)
    except (ValueError, OSError, RuntimeError) as error:
        print(f"gnomon: error: {error}", file=sys.stderr)
        return 2
    report.print_table(doc)
    print(f"wrote {options.out}")
    return 0


def _add_dash_parser(commands) -> None:  # noqa: ANN001 - argparse's private subparsers type
    dash = commands.add_parser("dash", help="the kernel regression dashboard")
    sub = dash.add_subparsers(dest="dash_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", metavar="URL",
                        help="database URL (default: $GNOMON_DB, else "
                             "sqlite:///.gnomon/bench.sqlite under the current directory)")
    thresholds = argparse.ArgumentParser(add_help=False)
    thresholds.add_argument("--threshold", default="5%",
                            help="smallest change that counts, e.g. 5%% (default) or 0.05")
    thresholds.add_argument("--threshold-op", action="append", default=[], metavar="OP=T",
                            help="per-op threshold, e.g. paged_attention=10%% (repeatable)")
    ingest = sub.add_parser("ingest", parents=[common],
                            help="store results files, validation and accuracy documents")
    ingest.add_argument("files", nargs="+", metavar="FILE")
    compare = sub.add_parser("compare", parents=[common, thresholds],
                             help="compare two commits on one machine")
    compare.add_argument("base", metavar="BASE")
    compare.add_argument("head", metavar="HEAD")
    compare.add_argument("--machine", metavar="M", help="machine fingerprint (or prefix)")
    compare.add_argument("--markdown", metavar="FILE", help="also write a Markdown table")
    compare.add_argument("--allow-ambiguous", action="store_true",
                         help="exit 0 when keys are AMBIGUOUS (by default: exit 3; a "
                              "REGRESSION exits 1)")
    sub.add_parser("history", parents=[common, thresholds],
                   help="detect and record steps along the commit order")
    ack = sub.add_parser("ack", parents=[common], help="acknowledge a benchmark's open steps")
    ack.add_argument("key", metavar="KEY")
    ack.add_argument("--reason", required=True)
    site = sub.add_parser("site", parents=[common], help="write the static site")
    site.add_argument("out", metavar="OUT")
    migrate = sub.add_parser("migrate", parents=[common],
                             help="bring the database to this gnomon's schema version")
    migrate.add_argument("--dry-run", action="store_true",
                         help="print the version found and what would change; change nothing")


def _run_dash(args) -> int:  # noqa: ANN001
    from gnomon.documents import DocumentError

    try:
        from gnomon.dash import cli_support
    except ImportError as error:  # the dash extra is missing
        print(f"gnomon: error: gnomon dash needs the dash extra "
              f"(pip install 'gnomon[dash]'): {error}", file=sys.stderr)
        return 2
    try:
        return cli_support.run(args)
    except (cli_support.DashError, DocumentError) as error:
        print(f"gnomon: error: {error}", file=sys.stderr)
        return 2


def _add_generate_parser(commands) -> None:  # noqa: ANN001
    gen = commands.add_parser("generate", help="generate tokens with the engine")
    gen.add_argument("--model", required=True, help="a model folder or a preset name")
    gen.add_argument("--random-weights", action="store_true",
                     help="random weights (required for presets)")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="a text prompt (needs the folder's tokenizer.json)")
    prompt.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    gen.add_argument("--max-tokens", type=int, default=16, help="tokens to generate (16)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    gen.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    gen.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    gen.add_argument("--device", default="cpu", help="cpu or cuda[:N] (a GPU build; default cpu)")
    gen.add_argument("--tp", type=int, default=1,
                     help="tensor-parallel ranks (default 1): N processes over torch.distributed")


def _run_generate(args) -> int:  # noqa: ANN001
    try:
        if args.prompt_ids is not None:
            try:
                prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
            except ValueError:
                raise ValueError(f"--prompt-ids: expected comma-separated integers, "
                                 f"got {args.prompt_ids!r}") from None
            if not prompt:
                raise ValueError("--prompt-ids: expected at least one token id")
        else:
            prompt = args.prompt
        from rich.progress import Progress

        from gnomon.engine.llm import LLM
        from gnomon.engine.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                seed=args.seed)
        with LLM(args.model, random_weights=args.random_weights, dtype=args.dtype,
                 device=args.device, tensor_parallel_size=args.tp) as llm, \
                Progress(transient=True) as bar:
            task = bar.add_task("generating", total=args.max_tokens)

            rid = llm.next_request_id  # the id generate() gives the prompt

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=len(llm.engine.get_output(rid).outputs[0].token_ids))

            outputs = llm.generate([prompt], params, progress=progress)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
        msg = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"gnomon: error: {msg}", file=sys.stderr)
        return 2
    out = outputs[0].outputs[0]
    print(f"token_ids: {','.join(map(str, out.token_ids))}")
    if out.text is not None:
        print(f"text: {out.text}")
    print(f"finish_reason: {out.finish_reason}")
    return 0


def _error(error) -> int:
    msg = error.args[0] if isinstance(error, KeyError) and error.args else error
    print(f"gnomon: error: {msg}", file=sys.stderr)
    return 2


def _catalogue_epilog() -> str:
    from gnomon.engine.config import PRESETS
    from gnomon.hardware import GPUS

    return (f"model presets: {', '.join(PRESETS)}\n"
            f"hardware: {', '.join(g.name for g in GPUS)}, host (this CPU, measured), or a "
            f".json/.yaml file (the README has a complete example)\n"
            f"engines: vllm, sglang, gnomon, or a .json profile")


def _add_serving_arguments(p, sweep: bool) -> None:  # noqa: ANN001
    """The flags of a serving simulation, shared by simulate and sweep. With `sweep` the axes
    (hardware, tp, concurrency, batched tokens, sequences, rate) take comma-separated lists."""
    from gnomon.predict import defaults as sim

    many = " (a comma-separated list sweeps it)" if sweep else ""
    p.add_argument("--model", default=sim.DEFAULT_MODEL,
                   help=f"a preset or model folder (default {sim.DEFAULT_MODEL})")
    p.add_argument("--hardware", default=sim.DEFAULT_HARDWARE,
                   help=f"a GPU name, host, or a .json/.yaml file "
                        f"(default {sim.DEFAULT_HARDWARE}){many}")
    p.add_argument("--workload", default=sim.DEFAULT_WORKLOAD,
                   help="chat, long-context, random (vllm bench's: 1024 in, 128 out), "
                        "sharegpt (ShareGPT-like lengths) or trace:FILE (CSV/JSONL; "
                        "default chat)")
    p.add_argument("--input-len", default=None, metavar="N|LOW:HIGH",
                   help="prompt tokens: fixed, or uniform in [LOW, HIGH]; replaces the "
                        "workload's")
    p.add_argument("--output-len", default=None, metavar="N|LOW:HIGH",
                   help="output tokens, likewise")
    p.add_argument("--rate", default=str(sim.DEFAULT_RATE),
                   help=f"requests/s (default {sim.DEFAULT_RATE:g}); inf sends every request at "
                        f"t=0; a comma-separated list (2,4,8,16) sweeps them, a row each")
    p.add_argument("--concurrency", default=None, metavar="N",
                   help=f"at most N requests in flight (vllm bench serve --max-concurrency); "
                        f"with --rate inf a closed loop of N users{many}")
    p.add_argument("--num-requests", type=int, default=None,
                   help=f"requests (default {sim.DEFAULT_NUM_REQUESTS}; a trace: all rows)")
    p.add_argument("--engine", default=sim.DEFAULT_ENGINE,
                   help=f"vllm, vllm-0.10, sglang, trtllm, gnomon or a .json profile: the "
                        f"scheduler defaults on this GPU, the host overhead per step and the "
                        f"serving path (default {sim.DEFAULT_ENGINE})")
    p.add_argument("--max-num-seqs", default=None,
                   help=f"sequences per step (default: the engine's){many}")
    p.add_argument("--max-num-batched-tokens", default=None,
                   help=f"tokens per step (default: the engine's){many}")
    p.add_argument("--engine-settings", default="", metavar="KEY=VALUE;...",
                   help="what the server is launched with beyond the engine's defaults, fields "
                        "of gnomon.EngineConfig (batch_wait_timeout_iters=20;"
                        "batch_wait_max_tokens_ratio=0.9 is TensorRT-LLM's batch waiting)")
    p.add_argument("--weight-dtype", default="auto",
                   help="auto (the config's quantization_config), bfloat16, float16, fp8, "
                        "nvfp4 or mxfp4 (the dense linear weights; FP4 runs on the FP4 peak "
                        "where the chip has one, weight-only elsewhere)")
    p.add_argument("--kv-dtype", default="auto", help="auto, bfloat16, float16 or fp8")
    p.add_argument("--no-hybrid-kv", action="store_true",
                   help="keep full KV on sliding-window layers (by default they keep only "
                        "their window, as vLLM's hybrid KV cache)")
    p.add_argument("--predictor", default="roofline",
                   help=f"{sim.PREDICTOR_FORMS} (default roofline)")
    p.add_argument("--tp", default="1", help=f"tensor-parallel GPUs (default 1){many}")
    p.add_argument("--ep", default="1",
                   help=f"expert parallelism: split a MoE model's routed experts over this many "
                        f"of the tp x dp GPUs (default 1: every GPU holds a slice of every "
                        f"expert){many}")
    p.add_argument("--dp", default="1",
                   help=f"attention data parallelism: this many groups of tp GPUs, each with its "
                        f"own scheduler, requests and KV cache, sharing a MoE model's expert "
                        f"layers (default 1){many}")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--slo-ttft-ms", type=float, default=None,
                   help="TTFT bound in ms (goodput's, default 2000; sweep: keep only the "
                        "configurations whose mean TTFT meets it)")
    p.add_argument("--slo-tpot-ms", type=float, default=None,
                   help="TPOT bound in ms (goodput's, default 100; sweep: likewise, on the "
                        "mean TPOT, 1000 / tok/s per user)")
    p.add_argument("--out", default=None, help="write the JSON document here")


def _add_simulate_parser(commands) -> None:  # noqa: ANN001
    p = commands.add_parser(
        "simulate", help="predict TTFT, TPOT and throughput of a model on a GPU, without one",
        description="Runs a workload through gnomon's real scheduler on a simulated runner.",
        epilog=_catalogue_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_serving_arguments(p, sweep=False)
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="a simulation spec, or a report that embeds one (every --out report "
                        "does): runs it again exactly; replaces the serving flags")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="write latency CDFs and KV usage over time to this PNG")


def _add_sweep_parser(commands) -> None:  # noqa: ANN001
    p = commands.add_parser(
        "sweep", help="simulate a grid of serving configurations; the Pareto frontier",
        description="One simulation per point of a grid (list-valued flags, or --spec FILE), "
                    "in parallel; prints the frontier of output tok/s per GPU against tok/s "
                    "per user and writes every point's report.",
        epilog=_catalogue_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_serving_arguments(p, sweep=True)
    p.add_argument("--spec", default=None, metavar="FILE",
                   help="a YAML/JSON spec: {grid: {axis: [values]}, <fixed flags>}; replaces "
                        "the serving flags")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="local worker processes (default: the CPU count)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the points as Ray tasks on the cluster at ADDRESS, or on a local "
                        "one without it (pip install 'gnomon[ray]')")
    p.add_argument("--resume", action="store_true",
                   help="go on with --out: points already in it are not run again")
    p.add_argument("--cost-per-gpu-hour", default=None, metavar="NAME=USD,...",
                   help="prices per GPU-hour (no built-in list): adds $ per million output "
                        "tokens")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="tok/s per GPU against tok/s per user, a curve per hardware and tp, "
                        "the Pareto points marked and labelled")


def _positive(text, flag: str):
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{flag}: expected a positive integer, got {text!r}")
    return value


def _listed(text, parse, flag: str) -> list:
    """A comma-separated flag's values, each through `parse(item, flag)`."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise ValueError(f"{flag}: expected at least one value")
    return [parse(item, flag) for item in items]


def _check_plot_dependency(path) -> None:
    """--plot needs matplotlib: said before any point runs, not after."""
    if path:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError("--plot needs matplotlib: pip install matplotlib (or pip install "
                             "'gnomon[dash]')") from None


def _serving_spec(args, sweep: bool):  # noqa: ANN001
    """The `SweepSpec` of the serving flags: a `SimulationSpec` of the one-valued flags and
    the list-valued axes when `sweep`, else only the rate may list (a one-axis sweep)."""
    from gnomon.predict import workloads
    from gnomon.predict.spec import SimulationSpec
    from gnomon.predict.sweep import SweepSpec

    trace_file = args.workload.startswith("trace:")
    slo = {"ttft_s": (2000.0 if args.slo_ttft_ms is None else args.slo_ttft_ms) / 1e3,
           "tpot_s": (100.0 if args.slo_tpot_ms is None else args.slo_tpot_ms) / 1e3}
    base = dict(model=args.model, workload=args.workload,
                num_requests=args.num_requests, predictor=args.predictor, seed=args.seed,
                engine=args.engine, weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype,
                slo=slo, enable_hybrid_kv=not args.no_hybrid_kv)
    for name, flag in (("input_len", "--input-len"), ("output_len", "--output-len")):
        text = getattr(args, name)
        base[name] = None if text is None else workloads.parse_length(text, flag)
    if args.engine_settings:
        from gnomon.predict.measured import parse_settings

        base["engine_settings"] = parse_settings(args.engine_settings, "--engine-settings")
    integer = lambda item, flag: _positive(item, flag)  # noqa: E731
    given = {"hardware": (args.hardware, lambda item, flag: item),
             "tp": (args.tp, integer), "ep": (args.ep, integer), "dp": (args.dp, integer),
             "concurrency": (args.concurrency, integer),
             "max_num_batched_tokens": (args.max_num_batched_tokens, integer),
             "max_num_seqs": (args.max_num_seqs, integer),
             "rate": (None if trace_file else args.rate, _rate_value)}
    axes = {}
    for name, (text, parse) in given.items():
        flag = "--" + name.replace("_", "-")
        values = [None] if text is None else _listed(text, parse, flag)
        if len(values) > 1 and not sweep and name != "rate":
            raise ValueError(f"{flag}: takes one value here (gnomon sweep takes a list)")
        if len(values) > 1:
            axes[name] = values
        else:
            base[name] = values[0]
    return SweepSpec(SimulationSpec.of(**base), axes)


def _rate_value(item: str, flag: str):
    """A rate as a sweep spec stores it: JSON has no infinity, so "inf" stays a string."""
    rate = _rates(item)[0]
    return "inf" if rate == float("inf") else rate


def _rates(text: str) -> list:
    from gnomon.predict.workloads import parse_rate

    rates = [parse_rate(r.strip()) for r in text.split(",") if r.strip()]
    if not rates:
        raise ValueError("--rate: expected at least one rate")
    return rates


def _run_simulate(args) -> int:  # noqa: ANN001
    from rich.console import Console
    from rich.progress import Progress

    from gnomon import documents
    from gnomon.predict import report as reports
    from gnomon.predict import simulate as sim
    from gnomon.predict import sweep
    from gnomon.predict.spec import SimulationSpec

    try:
        spec = (sweep.SweepSpec(SimulationSpec.load(args.spec)) if args.spec
                else _serving_spec(args, sweep=False))
        if spec.axes and args.plot:
            raise ValueError("--plot: draws one run; pass a single --rate")
        _check_plot_dependency(args.plot)
        if spec.axes:  # a rate sweep: the sweep's own mechanism, one axis
            doc = sweep.run_sweep(spec, jobs=1)
            refused = [r for r in doc["points"] if r["status"] != sweep.COMPLETE]
            if refused:
                raise ValueError(refused[0]["reason"])
            done_reports = [r["report"] for r in doc["points"]]
            if args.out:  # simulate's --out is replaced, as a single run's is
                documents.dump(doc, args.out)
        else:
            with Progress(console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task("simulating", total=None)
                shown = [-1]

                def progress(done: int, total: int) -> None:
                    if done != shown[0]:  # called every step; redraw only on a change
                        shown[0] = done
                        bar.update(task, completed=done, total=total)

                report, _ = sim.simulate(spec.base, progress=progress)
            done_reports = [report]
            if args.out:
                reports.dump(report, args.out)
        if args.plot:
            reports.plot(done_reports[0], args.plot)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
        return _error(error)
    if len(done_reports) == 1:
        reports.render_table(done_reports[0])
    else:
        reports.render_sweep(done_reports)
    for path in (args.out, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _run_sweep(args) -> int:  # noqa: ANN001
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from gnomon.predict import sweep

    try:
        spec = sweep.SweepSpec.from_file(args.spec) if args.spec else _serving_spec(args, True)
        bounds = dict(spec.frontier)  # the flags, where given, over the spec file's
        for name, ms in (("max_ttft_s", args.slo_ttft_ms), ("max_tpot_s", args.slo_tpot_ms)):
            if ms is not None:
                bounds[name] = ms / 1e3
        prices = sweep.parse_prices(args.cost_per_gpu_hour)
        if prices:
            bounds["usd_per_gpu_hour"] = prices
        spec = sweep.SweepSpec(spec.base, spec.axes, bounds)
        _check_plot_dependency(args.plot)
        columns = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("points", total=len(spec.points()))
            doc = sweep.run_sweep(spec, out=args.out, resume=args.resume, jobs=args.jobs,
                                  use_ray=args.ray is not None, ray_address=args.ray or None,
                                  progress=lambda done, total: bar.update(
                                      task, completed=done, total=total))
        if args.plot:
            sweep.plot(doc, args.plot)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
        return _error(error)
    sweep.render(doc)
    for path in (args.out, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def _add_calibrate_parser(commands) -> None:  # noqa: ANN001
    from gnomon.predict import defaults as cal

    p = commands.add_parser(
        "calibrate", help="fit a step-cost predictor to this machine",
        description="Runs a bench sweep and a calibration workload through the real engine "
                    "on this machine and writes the fitted CalibratedPredictor.")
    p.add_argument("--model", default=cal.CALIBRATION_MODEL,
                   help=f"a model folder or preset (presets use random weights; default "
                        f"{cal.CALIBRATION_MODEL})")
    p.add_argument("--out", default="calibration.json", help="(default calibration.json)")
    p.add_argument("--bench-suites", default=",".join(cal.CALIBRATION_BENCH_SUITES),
                   help="gnomon bench suites to sweep, '' for none (default %(default)s)")
    p.add_argument("--num-requests", type=int, default=cal.CALIBRATION_REQUESTS,
                   help="requests in the calibration workload (default %(default)s)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks the engine runs (and the fit prices) at; the "
                        "comm suite joins the sweep above 1 (default 1)")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda[:N]: where the bench sweep, the GEMM sweep and the real "
                        "engine run (a GPU build; default cpu)")


def _run_calibrate(args) -> int:  # noqa: ANN001
    import os

    from gnomon.predict import calibrate as cal

    suites = [s for s in args.bench_suites.split(",") if s.strip()]
    try:
        predictor = cal.calibrate(args.model, random_weights=not os.path.isdir(args.model),
                                  bench_suites=suites, num_requests=args.num_requests,
                                  tp=args.tp, device=args.device)
        predictor.save(args.out)
    except (ValueError, TypeError, KeyError, OSError) as error:
        return _error(error)
    info = predictor.info
    print(f"fitted on {info['step_rows']} steps and {info['bench_rows']} bench cases; in-sample "
          f"step error median {info['in_sample_step_ape_median']:.1%}, "
          f"p90 {info['in_sample_step_ape_p90']:.1%}")
    print(f"wrote {args.out}")
    return 0


def _add_validate_parser(commands) -> None:  # noqa: ANN001
    from gnomon.predict import defaults

    p = commands.add_parser(
        "validate", help="measure the calibrated predictor against the real engine here",
        description="Calibrates on one workload, runs another twice for real and once "
                    "simulated, and reports per-step and TTFT/TPOT/throughput errors.")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--model", default=defaults.CALIBRATION_MODEL,
                   help=f"a preset, run with random weights (default "
                        f"{defaults.CALIBRATION_MODEL}; llama-1b and gpt-oss-1b are sized for "
                        f"a GPU)")
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda[:N]: where calibration and the real runs happen; the "
                        "simulation prices that GPU's catalogue entry (default cpu: this "
                        "machine, measured)")
    p.add_argument("--num-requests", type=int, default=120, help="(default 120)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel ranks for the calibration, the real runs and the "
                        "simulation; reports the communication share (default 1)")
    p.add_argument("--num-calibration-requests", type=int,
                   default=defaults.CALIBRATION_REQUESTS,
                   help="requests in the calibration workload (default %(default)s)")
    p.add_argument("--commit", default=None,
                   help="the commit the report is of (default: the checkout's HEAD)")
    p.add_argument("--no-goal-gate", action="store_true",
                   help="exit 0 even when a goal is missed (a noisy machine's CI)")


def _run_validate(args) -> int:  # noqa: ANN001
    from gnomon.predict import validate as val

    try:
        report = val.validate(args.model, num_requests=args.num_requests, tp=args.tp,
                              device=args.device, commit=args.commit,
                              calibration_requests=args.num_calibration_requests,
                              progress=lambda stage: print(stage, file=sys.stderr))
        if args.out:
            val.dump(report, args.out)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
        return _error(error)
    val.render(report)
    if args.out:
        print(f"wrote {args.out}")
    return 0 if args.no_goal_gate or all(g["met"] for g in report["goal"].values()) else 1


def _add_accuracy_parser(commands) -> None:  # noqa: ANN001
    from gnomon.predict.defaults import PREDICTOR_FORMS

    p = commands.add_parser(
        "accuracy", help="gnomon simulate against measured serving runs",
        description="Simulates every measured serving run of a points file as its benchmark "
                    "ran and reports how far the answers are: per row, per group (model x "
                    "hardware x engine x dtype x source), and the coverage with the refusals "
                    "by reason.")
    p.add_argument("--points", default="silicon", metavar="silicon|published|FILE",
                   help="silicon: aiconfigurator-core's systems/silicon_sample.csv where that "
                        "package is installed (pip install 'gnomon[accuracy]'); published: the "
                        "published points gnomon ships; or a silicon_sample.csv or a CSV/JSONL "
                        "file in gnomon's schema (gnomon.predict.measured.FIELDS) "
                        "(default %(default)s)")
    p.add_argument("--split", default="all", choices=("fit", "held-out", "all"),
                   help="fit rows may tune the predictors; held-out rows are only reported "
                        "(default %(default)s)")
    for flag, what in (("--model", "gnomon models"), ("--hardware", "hardware names"),
                       ("--engine", "engine profiles")):
        p.add_argument(flag, default="", help=f"keep only these {what} (comma-separated)")
    p.add_argument("--predictor", default="roofline", help=f"{PREDICTOR_FORMS}")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="local worker processes (default: the CPU count)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the rows as Ray tasks on the cluster at ADDRESS, or a local one")
    p.add_argument("--max-waves", type=int, default=None,
                   help="a closed loop simulates at most this many waves of its concurrency, "
                        "its steady ones weighed as the benchmark ran them; 0 for every "
                        "request (default gnomon.predict.scorecard.MAX_WAVES)")
    p.add_argument("--out", default=None, help="write the accuracy document here (JSON)")
    p.add_argument("--commit", default=None,
                   help="the gnomon commit the document measures (default: the checkout's)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="predicted against measured, log-log, a panel per metric")


def _run_accuracy(args) -> int:  # noqa: ANN001
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from gnomon.predict import measured, scorecard

    try:
        _check_plot_dependency(args.plot)
        points, refused, source = measured.resolve_points(args.points)
        filters = {name: [v.strip() for v in getattr(args, name).split(",") if v.strip()]
                   for name in ("model", "hardware", "engine")}
        chosen = dict(split=args.split, models=filters["model"], hardware=filters["hardware"],
                      engines=filters["engine"])
        points = scorecard.filter_points(points, **chosen)
        refused = scorecard.filter_refusals(refused, **chosen)
        if not points and not refused:
            raise ValueError("--points: no row is left after the filters")
        columns = (TextColumn("accuracy"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("rows", total=len(points))
            doc = scorecard.run(
                points, predictor=args.predictor,
                max_waves=(scorecard.MAX_WAVES if args.max_waves is None else args.max_waves),
                jobs=args.jobs,
                use_ray=args.ray is not None, ray_address=args.ray or None, source=source,
                refused=refused, commit=args.commit,
                progress=lambda done, total: bar.update(task, completed=done, total=total))
        if args.out:
            scorecard.dump(doc, args.out)
        if args.plot:
            scorecard.plot(doc, args.plot)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError) as error:
        return _error(error)
    scorecard.render(doc)
    for path in (args.out, args.plot):
        if path:
            print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `gnomon` command's parser, every subcommand on it."""
    parser = argparse.ArgumentParser(prog="gnomon", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="what this build of gnomon holds")
    info.add_argument("--json", action="store_true", help="print the build summary as JSON")
    _add_bench_parser(commands)
    _add_dash_parser(commands)
    _add_generate_parser(commands)
    _add_simulate_parser(commands)
    _add_sweep_parser(commands)
    _add_calibrate_parser(commands)
    _add_validate_parser(commands)
    _add_accuracy_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ModuleNotFoundError as error:
        if error.name not in ENGINE_MODULES:
            raise
        print(f"gnomon: error: gnomon {args.command} needs the engine extra "
              f"({ENGINE_EXTRA}); {error.name} is not installed", file=sys.stderr)
        return 2


def _dispatch(args) -> int:  # noqa: ANN001
    if args.command == "info":
        _print_info(args.json)
    elif args.command == "bench":
        return _run_bench(args)
    elif args.command == "dash":
        return _run_dash(args)
    elif args.command == "generate":
        return _run_generate(args)
    elif args.command == "simulate":
        return _run_simulate(args)
    elif args.command == "sweep":
        return _run_sweep(args)
    elif args.command == "calibrate":
        return _run_calibrate(args)
    elif args.command == "validate":
        return _run_validate(args)
    elif args.command == "accuracy":
        return _run_accuracy(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
