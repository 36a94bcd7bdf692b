"""What a results file says about where and from what it was measured: the machine (with a
fingerprint built from stable fields only), the git commit, and the peaks that fractions of peak
are taken against."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Optional

from gnomon import hardware

_SHA = re.compile(r"[0-9a-f]{40}")


# --- machine ----------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ram_gb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20))  # kB -> GiB, rounded
    except (OSError, ValueError, IndexError):
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    except (ValueError, OSError, AttributeError):
        return 0


def _gpu_fields() -> Dict[str, Optional[str]]:
    import torch

    name = torch.cuda.get_device_name(torch.cuda.current_device())
    if torch.version.hip:
        runtime = f"hip {torch.version.hip}"
        try:
            driver = Path("/sys/module/amdgpu/version").read_text().strip() or None
        except OSError:
            driver = None
    else:
        runtime = f"cuda {torch.version.cuda}"
        driver = None
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=10).stdout.split()
            driver = out[0] if out else None
        except (OSError, subprocess.SubprocessError):
            pass
    return {"gpu_name": name, "driver": driver, "runtime": runtime}


def gpu_backend() -> str:
    """"hip" under a ROCm build of torch, else "cuda" (torch names both devices cuda)."""
    import torch

    return "hip" if torch.version.hip else "cuda"


def machine_info(device: str) -> Dict[str, Any]:
    """The results file's ``machine`` object. The fingerprint is the first 16 hex digits of a
    SHA-256 over the stable fields only: device, CPU model, core count, RAM in GiB (rounded),
    and for a GPU run its name, driver and runtime versions. No hostname, no clock readings."""
    fields: Dict[str, Any] = {"device": device, "cpu_model": _cpu_model(),
                              "cores": os.cpu_count() or 0, "ram_gb": _ram_gb(),
                              "gpu_name": None, "driver": None, "runtime": None}
    if device != "cpu":
        fields.update(_gpu_fields())
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return {"fingerprint": hashlib.sha256(blob.encode()).hexdigest()[:16], **fields}


# --- commit -----------------------------------------------------------------------------------

def _git_head(directory: Path) -> Optional[str]:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = result.stdout.strip().lower()
    return sha if result.returncode == 0 and _SHA.fullmatch(sha) else None


def resolve_commit(commit: Optional[str] = None, cwd: Optional[Path] = None) -> str:
    """`commit` if given (40 hex digits), else ``git rev-parse HEAD`` in the current directory,
    else in the directory gnomon was imported from. Raises ValueError otherwise."""
    if commit is not None:
        sha = commit.strip().lower()
        if not _SHA.fullmatch(sha):
            raise ValueError(f"--commit: expected a full 40-hex-digit git SHA, got {commit!r}")
        return sha
    import gnomon

    places = [Path(cwd or os.getcwd()), Path(gnomon.__file__).resolve().parent]
    for place in places:
        sha = _git_head(place)
        if sha:
            return sha
    raise ValueError(f"cannot read the git commit: neither {places[0]} nor {places[1]} is in "
                     f"a git checkout (or git is not installed); pass --commit SHA")


# --- peaks ------------------------------------------------------------------------------------

def _best_seconds(fn, repeats: int, min_seconds: float) -> float:
    """The fastest of at least `repeats` calls, repeating until `min_seconds` have passed,
    after `min_seconds` of warm-up calls. On a shared machine a parallel region can wait a
    scheduler tick for a busy core, and a fresh process's first tenth of a second of matmuls
    can run at a tenth of the rate (seen on this 2-core CI machine); only the fastest call
    after a warm-up tells the machine's rate."""
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < min_seconds:
        fn()
    best, start, count = float("inf"), time.perf_counter(), 0
    while count < repeats or time.perf_counter() - start < min_seconds:
        begin = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - begin)
        count += 1
    return best


def measure_cpu_peaks(llc_bytes: int, quick: bool = False) -> Dict[str, Any]:
    """This CPU's copy bandwidth and torch matmul FLOP rates, measured now, at gnomon's thread
    count: ``torch.Tensor.copy_`` of a float32 buffer of max(64 MiB, 4 x LLC) (read + write
    bytes), and square float32 and bfloat16 ``torch.matmul`` (2 n^3 FLOPs); each the fastest
    call of several."""
    import torch

    from gnomon.ops import num_threads

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads())
    try:
        size = max(64 << 20, 4 * llc_bytes)
        src = torch.ones(size // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        budget = 0.15 if quick else 0.4
        copy_s = _best_seconds(lambda: dst.copy_(src), 3 if quick else 5, budget)
        del src, dst
        tflops = {}
        n = 512 if quick else 1024
        for dtype in ("float32", "bfloat16"):
            a = torch.randn(n, n).to(getattr(torch, dtype))
            b = torch.randn(n, n).to(getattr(torch, dtype))
            seconds = _best_seconds(lambda: torch.matmul(a, b), 3 if quick else 5, budget)
            tflops[dtype] = 2 * n ** 3 / seconds / 1e12
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
    return {"memory_gbps": 2 * size / copy_s / 1e9, "tflops": tflops,
            "source": (f"measured in this run on {threads} thread(s): copy_ of "
                       f"{size >> 20} MiB float32 (read + write), {n}x{n} torch.matmul in "
                       f"float32 and bfloat16 (2 n^3 FLOPs); each the fastest call in "
                       f"{budget} s")}


def gpu_peaks(gpu_name: str) -> Dict[str, Any]:
    """Datasheet peaks for a GPU that gnomon.hardware knows by its exact device name; for any
    other GPU, no peaks (fractions of peak are then null rather than guessed)."""
    entry = hardware.from_device_name(gpu_name)
    if entry is None:
        return {"memory_gbps": None, "tflops": {},
                "source": f"GPU {gpu_name!r} is not in gnomon.hardware; no fraction of peak"}
    tflops = {dtype: entry.tflops(dtype) for dtype in ("bfloat16", "float16", "fp8", "fp4")
              if entry.tflops(dtype) is not None}
    return {"memory_gbps": entry.hbm_tbps.value * 1000, "tflops": tflops,
            "interconnect_gbps": entry.interconnect_gbps.value,
            "source": f"gnomon.hardware {entry.name}: {entry.bf16_tflops.source}"}
