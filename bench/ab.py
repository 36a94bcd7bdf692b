"""Two or more builds of gnomon's kernels timed in one process, call by call.

    python bench/ab.py CASE THREADS SOURCE [SOURCE ...]

Each SOURCE is a source tree (this checkout, or a `git worktree` of the revision to compare);
it is built into build/ab/<tree name> with its own pybind11 internals id, so that every build
loads into this process as a module of its own. Two loads of the same id would give one module
twice (Python caches extension modules, pybind11 registers each type once), and an A/B of it
would compare a build with itself. The case's calls then alternate between the builds (the
order reversed every round, each call after a 30 ms busy wait, as conftest.paired_speedup),
and each build's median time, its median time ratio to the first build and the torch
baseline's speed relative to it are printed. This VM's speed drifts ~2.5x between stretches of
seconds; only such interleaved ratios compare builds reliably.

CASE: prefill (256 tokens on 2,048 cached, bench/test_attention.py), moe-T (gpt-oss-20b
fused_moe at T tokens, bench/test_moe.py) or mxfp4-M (mxfp4_gemm at M rows, N=5760, K=2880).
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import gnomon.ops.attention
import gnomon.ops.moe
import gnomon.ops.mxfp4
import gnomon.ops.norm
from gnomon.ops import _tensor

SWAPPED = (gnomon.ops.attention, gnomon.ops.moe, gnomon.ops.mxfp4, gnomon.ops.norm, _tensor)
ROOT = Path(__file__).resolve().parent.parent


def build(source: Path) -> Path:
    """The source tree's _C, built with an internals id of its own; returns the module's path."""
    name = source.resolve().name
    out = ROOT / "build" / "ab" / name
    if not (out / "build.ninja").exists():
        pybind11_dir = subprocess.check_output(
            [sys.executable, "-m", "pybind11", "--cmakedir"], text=True).strip()
        subprocess.run(["cmake", "-S", str(source), "-B", str(out), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={sys.executable}",
                        f"-Dpybind11_DIR={pybind11_dir}",
                        f'-DCMAKE_CXX_FLAGS=-DPYBIND11_COMPILER_TYPE=\\"ab_{name}\\"'],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", str(out), "_C"], check=True, stdout=subprocess.DEVNULL)
    return next(out.glob("_C*.so"))


def load(path: Path, index: int):
    spec = importlib.util.spec_from_file_location(f"gnomon_ab{index}._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case_calls(case: str):
    """(the gnomon call, the torch baseline call) of the case."""
    sys.path.insert(0, str(ROOT / "bench"))
    if case == "prefill":
        from test_attention import CASES, PREFILL, Case
        attention = Case(PREFILL, **CASES[PREFILL])
        return attention.gnomon, attention.gather_sdpa
    if case.startswith("moe-"):
        from test_moe import GPT_OSS, MoEBlock
        block = MoEBlock(**GPT_OSS, mxfp4=True).batch(int(case.removeprefix("moe-")))
        return block.gnomon(True), block.torch_loop()
    if case.startswith("mxfp4-"):
        from test_mxfp4 import gemm_call
        m = int(case.removeprefix("mxfp4-"))
        return (gemm_call("gnomon", m, 5760, 2880, True)[0],
                gemm_call("torch-bf16", m, 5760, 2880, True)[0])
    raise SystemExit(f"unknown case {case!r}: prefill, moe-T or mxfp4-M")


def settled(fn):
    start = time.perf_counter()
    while time.perf_counter() - start < 0.03:
        pass
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case")
    parser.add_argument("threads", type=int)
    parser.add_argument("sources", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    names = [source.resolve().name for source in args.sources]
    if len(set(names)) < len(names):  # one build folder per name: a build would serve twice
        raise SystemExit(f"sources: each tree needs a name of its own (build/ab/<name>), got "
                         f"{', '.join(names)}")
    modules = [load(build(source), i) for i, source in enumerate(args.sources)]
    torch.set_num_threads(args.threads)
    call, baseline = case_calls(args.case)

    def use(module):
        for swapped in SWAPPED:
            swapped._C = module

    times = [[] for _ in modules]
    baseline_times = []
    for r in range(args.rounds):
        order = range(len(modules)) if r % 2 == 0 else reversed(range(len(modules)))
        for i in order:
            use(modules[i])
            times[i].append(settled(call))
        baseline_times.append(settled(baseline))
    for i, source in enumerate(args.sources):
        ratio = statistics.median(a / b for a, b in zip(times[i], times[0]))
        speed = statistics.median(b / a for a, b in zip(times[i], baseline_times))
        print(f"{source}: median {statistics.median(times[i]) * 1e3:.2f} ms, "
              f"time ratio to {args.sources[0]} {ratio:.3f}, baseline time / this {speed:.2f}")


if __name__ == "__main__":
    main()
