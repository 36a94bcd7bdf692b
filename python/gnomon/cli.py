"""The `gnomon` command. It parses arguments and prints; the work lives in the library."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def build_summary() -> dict:
    from gnomon import _C

    info = _C.build_info()
    try:  # the thread count the kernels use follows torch's unless pinned
        from gnomon.ops import num_threads
    except ImportError:
        num_threads = _C.num_threads
    info["num_threads"] = num_threads()
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
    print(f"gpu backends: {', '.join(info['gpu_backends']) or 'none (CPU-only build)'}")
    print(f"threads:      {info['num_threads']}")


def _add_bench_parser(commands) -> None:
    bench = commands.add_parser(
        "bench", help="time gnomon's ops at model shapes and write a results file",
        description="Times every case of the chosen suites and writes a results JSON.")
    bench.add_argument("--suite", default=None,
                       help="comma-separated suites (attention, moe, mxfp4, norm; default all)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    bench.add_argument("--runs", default="1", help="repeat the sweep N times, interleaved")
    bench.add_argument("--quick", action="store_true", help="small shapes, short sampling")
    bench.add_argument("--mode", default="hot", help="hot (reuse inputs) or cold (default hot)")
    bench.add_argument("--out", default=None, help="results file (default bench-<commit12>.json)")
    bench.add_argument("--commit", default=None,
                       help="the git SHA measured, where there is no checkout to read it from")


def _error(message: str) -> int:
    print(f"gnomon: error: {message}", file=sys.stderr)
    return 2


def _run_bench(args) -> int:
    from pathlib import Path

    from rich.console import Console

    from gnomon.bench import report, runner, suites

    try:
        names = suites.parse_suites(args.suite)
        runner.check_device(args.device)
        try:
            runs = int(args.runs)
        except ValueError:
            raise ValueError(f"--runs: expected a positive integer, got {args.runs!r}") from None
        runner.check_runs_and_mode(runs, args.mode)
        commit = runner.resolve_commit(args.commit)
        out = Path(args.out) if args.out else runner.default_out(commit)
        runner.check_out(out)
        console = Console(stderr=True)
        with report.progress_bar(console) as progress:
            doc = runner.run_bench(names, device=args.device, runs=runs, quick=args.quick,
                                   mode=args.mode, commit=commit, progress=progress)
        runner.write_results(doc, out)
    except (ValueError, OSError) as error:
        return _error(str(error))
    stdout = Console()
    if not stdout.is_terminal:  # a file or pipe: print whole keys rather than folding them
        stdout = Console(width=240)
    stdout.print(report.table(doc))
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gnomon", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="what this build of gnomon holds")
    info.add_argument("--json", action="store_true", help="print the build summary as JSON")
    _add_bench_parser(commands)

    args = parser.parse_args(argv)
    if args.command == "info":
        _print_info(args.json)
    elif args.command == "bench":
        return _run_bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
