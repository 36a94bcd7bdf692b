"""Runs a sweep of benchmark cases and assembles the results document (see results.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from gnomon.bench import results, suites as suite_defs
from gnomon.bench.cases import COMM_OPS, Case, args_nbytes, bandwidth_peak, clone_args
from gnomon.bench.machine import (cpu_peaks, gpu_backend, gpu_peaks, machine_info,
                                  measure_cpu_peaks, resolve_commit)
from gnomon.bench.timing import (FULL, QUICK, CpuTimer, GpuTimer, SampleRun, Sampling,
                                 gpu_l2_bytes, last_level_cache_bytes, sample, summarize,
                                 warm_up)

DEVICES = ("cpu", "cuda")
MODES = ("hot", "cold")
MAX_COLD_COPIES = 4096

Progress = Callable[[int, int, str], None]  # (done, total, key of the case about to run)
CHILD = "import sys; from gnomon.bench.runner import _run_in_child; _run_in_child(*sys.argv[1:])"


@dataclass
class _Prepared:
    case: Case
    fn: Callable[..., Any]
    input_sets: List[tuple]
    inputs_info: Dict[str, Any]
    flush: Any = None  # a CPU buffer written before each sample, for inputs too small to rotate
    group: Any = None  # the comm suite's `CommGroup`, for a collective
    next_set: int = 0

    def session(self):
        """What surrounds the case's warm-up and samples: a collective's peers join it."""
        return self.group.session(self.case) if self.group else contextlib.nullcontext()

    def before_sample(self) -> None:
        if self.flush is not None:
            self.flush.add_(1)
        if self.group is not None:
            self.group.before_sample()

    def call(self) -> Any:
        args = self.input_sets[self.next_set]
        self.next_set = (self.next_set + 1) % len(self.input_sets)
        return self.fn(*args)


@dataclass(frozen=True)
class BenchOptions:
    """`gnomon bench`'s arguments, checked before any timing starts."""

    suites: List[str]
    device: str
    runs: int
    quick: bool
    mode: str
    out: Path
    commit: str

    @staticmethod
    def from_cli(suite: Optional[str], device: str, runs: str, quick: bool, mode: str,
                 out: Optional[str], commit: Optional[str]) -> "BenchOptions":
        """Parses and checks the command line's strings; raises ValueError naming the bad one.
        The commit comes from `commit` or the checkout; `out` defaults to bench-<commit12>.json
        and must be writable."""
        names = suite_defs.parse_suites(suite)
        check_device(device)
        try:
            count = int(runs)
        except ValueError:
            raise ValueError(f"--runs: expected a positive integer, got {runs!r}") from None
        check_runs_and_mode(count, mode)
        sha = resolve_commit(commit)
        path = Path(out) if out else default_out(sha)
        check_out(path)
        return BenchOptions(names, device, count, bool(quick), mode, path, sha)


def check_device(device: str) -> str:
    """Validates `device` ("cpu" or "cuda"); "cuda" needs a GPU that torch sees."""
    if device not in DEVICES:
        raise ValueError(f"--device: unknown device {device!r}; accepted: {', '.join(DEVICES)}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA or HIP GPU on this machine "
                             "(this machine accepts --device cpu)")
        from gnomon import _C

        if not _C.build_info()["gpu_backends"]:
            raise ValueError("--device cuda: this build of gnomon has no GPU kernels "
                             "(`gnomon info` shows its gpu backends); rebuild it with a GPU "
                             "backend, or use --device cpu")
    return device


def check_runs_and_mode(runs: int, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"--mode: unknown mode {mode!r}; accepted: {', '.join(MODES)}")
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"--runs: expected a positive integer, got {runs!r}")


def default_out(commit: str) -> Path:
    return Path(f"bench-{commit[:12]}.json")


def check_out(path: Path) -> None:
    """Raises ValueError unless `path` can be written (checked before a sweep starts)."""
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ValueError(f"--out {path}: the folder {parent} does not exist")
    if path.is_dir():
        raise ValueError(f"--out {path}: is a folder; give a file name")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--out {path}: the folder {parent} is not writable")


def _prepare(case: Case, device: str, mode: str, llc_bytes: int, group=None) -> _Prepared:
    """Builds a case's inputs (a collective runs over `group`). Cold on a CPU: copies of the
    inputs adding up to twice the last-level cache, used in turn; where that would take more
    than MAX_COLD_COPIES copies (tiny inputs), one set of inputs and a buffer of twice the cache
    written before each sample, outside the timed call."""
    fn, args = case.build(device)
    per_copy = args_nbytes(args)
    info: Dict[str, Any] = {"bytes_per_copy": per_copy, "copies": 1}
    sets, flush = [args], None
    if mode == "cold" and device == "cpu":
        wanted = max(2, math.ceil(2 * llc_bytes / max(per_copy, 1)))
        info["llc_bytes"] = llc_bytes
        if wanted <= MAX_COLD_COPIES:
            sets += [clone_args(args) for _ in range(wanted - 1)]
            info.update(cold="rotate", copies=wanted)
        else:
            import torch

            flush = torch.zeros(2 * llc_bytes // 4, dtype=torch.float32)
            info.update(cold="flush", flush_bytes=flush.numel() * 4)
    return _Prepared(case, fn, sets, info, flush, group if case.op in COMM_OPS else None)


def _case_record(prepared: _Prepared, run, warmup_calls: int, peaks: Dict[str, Any],
                 settings: Sampling) -> Dict[str, Any]:
    case = prepared.case
    stats = summarize(run.samples_ns)
    median_ns = stats["median"]
    flops, nbytes = case.flops, case.bytes
    tflops = flops / median_ns / 1e3 if median_ns > 0 else 0.0
    gbps = nbytes / median_ns if median_ns > 0 else 0.0
    record = {
        "key": case.key, "suite": case.suite, "op": case.op, "params": case.p,
        "dtypes": case.d, "definition_hash": case.definition_hash,
        "samples_ns": list(run.samples_ns), "stats": stats, "flops": flops, "bytes": nbytes,
        "tflops": tflops, "gbps": gbps,
        "compute_dtype": case.compute_dtype,
        "sampling": {"stopped": run.stopped,
                     "rel_spread": run.rel_spread if math.isfinite(run.rel_spread) else None,
                     "warmup_calls": warmup_calls, "rule": asdict(settings)},
        "inputs": dict(prepared.inputs_info),
    }
    return with_fractions(record, peaks)


def with_fractions(record: Dict[str, Any], peaks: Dict[str, Any]) -> Dict[str, Any]:
    """`record` (a case's) with its ``fraction_of_peak`` taken against `peaks`."""
    compute_peak = peaks.get("tflops", {}).get(record["compute_dtype"])
    memory_peak = bandwidth_peak(record["op"], peaks)
    record["fraction_of_peak"] = {
        "compute": record["tflops"] / compute_peak if record["flops"] and compute_peak else None,
        "memory": record["gbps"] / memory_peak if record["bytes"] and memory_peak else None}
    return record


def best_peaks(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """The higher of two CPU peak measurements, field by field, keeping both: on a shared
    machine another process can slow one of them several-fold. Measurements that carry their
    raw rates and the nominal ones are judged again together (`machine.cpu_peaks`), so a rate
    that was implausible in one and sound in the other is used."""
    if all("measured_tflops" in p and "nominal" in p for p in (before, after)):
        source = (f"{before.get('measured_source', before['source'])}; the better of before "
                  "and after the sweep")
        raw = {dtype: max(before["measured_tflops"].get(dtype, 0.0),
                          after["measured_tflops"].get(dtype, 0.0))
               for dtype in {**before["measured_tflops"], **after["measured_tflops"]}}
        peaks = cpu_peaks(max(before["memory_gbps"], after["memory_gbps"]), raw,
                          before["nominal"], source)
        if "vector_units" in before and "vector_units" in after:
            units = before["vector_units"]
            peaks["vector_units"] = dict(units, tflops={
                dtype: max(rate, after["vector_units"]["tflops"].get(dtype, 0.0))
                for dtype, rate in units["tflops"].items()})
        peaks["measurements"] = [before, after]
        return peaks
    tflops = {dtype: max(before["tflops"].get(dtype, 0.0), after["tflops"].get(dtype, 0.0))
              for dtype in {**before["tflops"], **after["tflops"]}}
    return {"memory_gbps": max(before["memory_gbps"], after["memory_gbps"]), "tflops": tflops,
            "source": f"{before['source']}; the better of before and after the sweep",
            "measurements": [before, after]}


def _checked(suites, device: str, runs: int, mode: str, commit: Optional[str]):
    """``(suite names, commit sha)``, every argument checked (ValueError naming it)."""
    names = list(suite_defs.SUITES) if suites is None else list(suites)
    for name in names:
        if name not in suite_defs.SUITES:
            raise ValueError(f"unknown suite {name!r}; known: {', '.join(suite_defs.SUITES)}")
    check_device(device)
    check_runs_and_mode(runs, mode)
    return names, resolve_commit(commit)


def run_bench(suites: Optional[Sequence[str]] = None, device: str = "cpu", runs: int = 1,
              quick: bool = False, mode: str = "hot", commit: Optional[str] = None,
              settings: Optional[Sampling] = None,
              progress: Optional[Progress] = None,
              peaks: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Runs every case of `suites` `runs` times in this process, interleaved (run 1 of every
    case, then run 2, ...; within a run, `Sampling.rounds` passes over the cases), and returns
    the results document. Each pass times inputs built for it, allocated while the previous
    pass's still live (so elsewhere in memory): a run's fastest sample then does not rest on
    one allocation's placement. Validates every argument before timing. `peaks` given, the
    CPU's are not measured (`run_isolated`'s runs take their parent's)."""
    names, commit = _checked(suites, device, runs, mode, commit)
    settings = settings or (QUICK if quick else FULL)

    import torch

    import gnomon
    from gnomon import _C
    from gnomon.ops import num_threads

    machine = machine_info(device if device == "cpu" else gpu_backend())
    llc_bytes, llc_source = last_level_cache_bytes()
    measure = peaks is None and device == "cpu"
    if device == "cpu":
        peaks = measure_cpu_peaks(llc_bytes, quick=quick) if measure else peaks
        timer: Any = CpuTimer()
    else:
        peaks = peaks or gpu_peaks(machine["gpu_name"])
        l2 = gpu_l2_bytes()
        timer = GpuTimer(flush_bytes=2 * l2 if mode == "cold" else 0)
        llc_bytes, llc_source = l2, "torch.cuda.get_device_properties().L2_cache_size"

    cases = suite_defs.cases(names, device, quick=quick)
    total = runs * settings.rounds * len(cases)
    done = 0
    collectives = [case for case in cases if case.op in COMM_OPS]
    with contextlib.ExitStack() as stack, torch.inference_mode():
        group = None
        if collectives:
            from gnomon.bench.comm import CommGroup

            group = CommGroup(collectives, device)
            stack.callback(group.close)
        prepared = [_prepare(case, device, mode, llc_bytes, group) for case in cases]
        timed = []
        each = settings.per_round()
        for index in range(runs):
            passes: Dict[int, list] = {i: [] for i in range(len(prepared))}
            warmups = dict.fromkeys(passes, 0)
            for round_ in range(settings.rounds):
                for i, item in enumerate(prepared):
                    if progress:
                        progress(done, total, item.case.key)
                    if index or round_:  # fresh inputs per pass, built while the last live
                        prepared[i] = item = _prepare(item.case, device, mode, llc_bytes, group)
                    with item.session():
                        warmups[i] += warm_up(lambda: item.before_sample() or item.call(),
                                              each, timer.sync)
                        passes[i].append(sample(
                            lambda: item.before_sample() or timer.time_call(item.call), each))
                    done += 1
            timed.append([(item, SampleRun.merged(passes[i]), warmups[i])
                          for i, item in enumerate(prepared)])
    if measure:  # measured again after the sweep; the best of the two is the peak
        peaks = best_peaks(peaks, measure_cpu_peaks(llc_bytes, quick=quick))
    run_docs = [{"index": index, "cases": [_case_record(item, run, warmups, peaks, settings)
                                           for item, run, warmups in cases_timed]}
                for index, cases_timed in enumerate(timed)]
    if progress:
        progress(done, total, "")

    build = dict(_C.build_info())
    build["num_threads"] = num_threads()
    build["torch"] = torch.__version__
    doc = {
        "schema_version": results.SCHEMA_VERSION, "kind": results.KIND, "commit": commit,
        "created_with": {"version": gnomon.__version__, "build": build},
        "machine": machine, "peaks": peaks, "mode": mode, "runs": run_docs,
        "suites": names, "quick": quick,
        "cache": {"bytes": llc_bytes, "source": llc_source},
    }
    return results.validate(doc)


def run_isolated(suites: Optional[Sequence[str]] = None, device: str = "cpu", runs: int = 1,
                 quick: bool = False, mode: str = "hot", commit: Optional[str] = None,
                 progress: Optional[Progress] = None) -> Dict[str, Any]:
    """`run_bench`'s document, each run timed in a fresh process of its own (what
    ``gnomon bench --runs N`` does, as pyperf runs its worker processes).

    Why: a process's state (where its buffers landed, how its threads were placed) holds for
    all its runs. On the 2-core machine of `bench/regression_gate.py` the fastest sample of a
    norm or a rotary embedding differed by 10-30 % between processes and by 1-3 % between runs
    in one process, so runs sharing a process are not independent replicates: two commits
    benched in two processes would differ by more than their runs scatter. The CPU's peaks are
    measured here, before and after, and every run's fractions are taken against their best."""
    names, commit = _checked(suites, device, runs, mode, commit)
    llc_bytes, _ = last_level_cache_bytes()
    peaks = (measure_cpu_peaks(llc_bytes, quick=quick) if device == "cpu"
             else gpu_peaks(machine_info(gpu_backend())["gpu_name"]))
    per_run = len(suite_defs.cases(names, device, quick=quick)) * (
        QUICK if quick else FULL).rounds
    docs = []
    with tempfile.TemporaryDirectory() as folder:
        spec = os.path.join(folder, "spec.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump({"suites": names, "device": device, "quick": quick, "mode": mode,
                       "commit": commit, "peaks": peaks}, f)
        for index in range(runs):
            if progress:
                progress(index * per_run, runs * per_run, f"run {index + 1} of {runs}")
            out = os.path.join(folder, f"run{index}.json")
            child = subprocess.run([sys.executable, "-c", CHILD, spec, out],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if child.returncode:
                raise RuntimeError(f"run {index + 1} of {runs} failed in its process (exit "
                                   f"{child.returncode}):\n{child.stderr[-4000:]}")
            docs.append(results.load(Path(out)))
    if device == "cpu":
        peaks = best_peaks(peaks, measure_cpu_peaks(llc_bytes, quick=quick))
    if progress:
        progress(runs * per_run, runs * per_run, "")
    doc = dict(docs[0], peaks=peaks, runs=[
        {"index": index, "cases": [with_fractions(case, peaks) for case in d["runs"][0]["cases"]]}
        for index, d in enumerate(docs)])
    return results.validate(doc)


def _run_in_child(spec_path: str, out: str) -> None:
    """One run of `run_isolated`, in this fresh process: the spec's suites with its peaks."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    write_results(run_bench(spec["suites"], device=spec["device"], runs=1, quick=spec["quick"],
                            mode=spec["mode"], commit=spec["commit"], peaks=spec["peaks"]),
                  Path(out))


def write_results(doc: Dict[str, Any], path: Path) -> None:
    """Writes `doc` with results.dump (atomically: a reader never sees a partial file)."""
    check_out(Path(path))
    results.dump(doc, path)
