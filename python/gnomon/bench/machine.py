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
from typing import Any, Dict, Optional, Tuple

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

# A measured CPU peak below this fraction of the nominal rate is re-measured longer, and if it
# is still below, it is not used as a peak. Why 1/16: the nominal rate is an upper bound that
# can be 2x high (AVX-512 split into two 256-bit halves on AMD Zen 4, or one 512-bit FMA port
# on some Intel parts) and 1.3-1.5x high again where "cpu MHz" reads above the all-core clock;
# torch's square matmul at n = 512-1024 reaches 30-80% of the true rate on a quiet core, and
# the best call of many on a loaded 2-core machine about half of that. An honest measurement
# therefore lands at 1/10 of nominal or above in the worst combination; 1/16 leaves margin
# under it, and still rejects what the issue saw (torch's bf16 matmul on an AVX2-only CPU at
# under 1/100 of the FMA rate, which turned a norm case into "452% of peak").
FLOOR_FRACTION = 1 / 16
FALLBACK_GHZ = 2.0  # when neither sysfs nor /proc/cpuinfo gives a clock

# FLOPs per cycle per core, (float32, bfloat16), by the widest SIMD path the flags allow.
# x86 with AVX2/AVX-512 is taken to have 2 FMA units per core (2 FLOPs per lane each); a CPU
# without bf16 arithmetic converts bf16 to fp32 and runs it at the fp32 FMA rate;
# AVX512-BF16's vdpbf16ps does twice the fp32 lanes' work per instruction; AMX-BF16 (Intel
# Sapphire Rapids and later) does 1024 bf16 FLOPs per cycle per core.
_FLOPS_PER_CYCLE = {
    "amx_bf16": (64, 1024),       # AVX-512 fp32, AMX tiles for bf16
    "avx512_bf16": (64, 128),     # 2 x 16 fp32 lanes x FMA; vdpbf16ps: 2 x 32 bf16 pairs
    "avx512": (64, 64),           # 2 x 16 lanes x FMA; bf16 converted to fp32
    "avx2_fma": (32, 32),         # 2 x 8 lanes x FMA
    "neon": (16, 16),             # aarch64: 2 x 4 lanes x FMA (a conservative count)
    "baseline": (8, 8),           # SSE2 or unknown: 4 lanes, one multiply and one add unit
}


def _cpuinfo_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: Optional[str] = None) -> set:
    """The CPU's feature flags: x86's ``flags`` line, aarch64's ``Features`` line."""
    text = _cpuinfo_text() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def simd_path(flags: set) -> str:
    """The widest SIMD path the flags allow, a key of the FLOPs-per-cycle table."""
    if "avx512f" in flags:
        if "amx_bf16" in flags:
            return "amx_bf16"
        return "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2_fma"
    if "asimd" in flags:
        return "neon"
    return "baseline"


def cpu_ghz(cpuinfo: Optional[str] = None,
            sysfs: str = "/sys/devices/system/cpu/cpu0/cpufreq") -> Tuple[float, str]:
    """The clock the nominal rate is taken at, in GHz, and where it came from: sysfs
    ``cpuinfo_max_freq`` (or ``scaling_max_freq``, both kHz), else the highest ``cpu MHz`` of
    /proc/cpuinfo (in a VM, often the base clock), else the "@ x.xxGHz" of the model name,
    else FALLBACK_GHZ, said so."""
    for name in ("cpuinfo_max_freq", "scaling_max_freq"):
        try:
            khz = int(Path(sysfs, name).read_text().strip())
        except (OSError, ValueError):
            continue
        if khz > 0:
            return round(khz / 1e6, 4), f"{sysfs}/{name}"
    text = _cpuinfo_text() if cpuinfo is None else cpuinfo
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)", text, re.M)]
    mhz = [m for m in mhz if m > 0]
    if mhz:
        return round(max(mhz) / 1000, 4), "/proc/cpuinfo cpu MHz"
    named = re.search(r"^model name\s*:.*@\s*([0-9.]+)\s*GHz", text, re.M)
    if named and float(named.group(1)) > 0:
        return float(named.group(1)), "/proc/cpuinfo model name"
    return FALLBACK_GHZ, f"no clock found; {FALLBACK_GHZ} GHz assumed"


def physical_cores(cpuinfo: Optional[str] = None) -> int:
    """Cores this process may run on, counting an SMT pair once (the pair shares its FMA
    units): the affinity mask's size divided by /proc/cpuinfo's siblings / cpu cores."""
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        logical = os.cpu_count() or 1
    text = _cpuinfo_text() if cpuinfo is None else cpuinfo
    siblings = re.search(r"^siblings\s*:\s*(\d+)", text, re.M)
    cores = re.search(r"^cpu cores\s*:\s*(\d+)", text, re.M)
    smt = 1
    if siblings and cores and int(cores.group(1)) > 0:
        smt = max(1, int(siblings.group(1)) // int(cores.group(1)))
    return max(1, logical // smt)


def nominal_cpu_peaks(threads: int, flags: Optional[set] = None, ghz: Optional[float] = None,
                      clock_source: str = "given", cores: Optional[int] = None
                      ) -> Dict[str, Any]:
    """The CPU's nominal float32 and bfloat16 FLOP rates on `threads` threads: cores x clock x
    FLOPs per cycle of its widest SIMD path (see _FLOPS_PER_CYCLE for what is assumed: 2 FMA
    units per core on AVX2/AVX-512 x86). Cores are min(threads, physical cores). It is an upper
    bound of the kind a datasheet gives, used as a sanity floor for measured peaks, never as
    a peak itself. Flags, clock and core count are read from this machine unless given."""
    flags = cpu_flags() if flags is None else flags
    if ghz is None:
        ghz, clock_source = cpu_ghz()
    cores = physical_cores() if cores is None else cores
    used = max(1, min(threads, cores))
    path = simd_path(flags)
    per_cycle = dict(zip(("float32", "bfloat16"), _FLOPS_PER_CYCLE[path]))
    return {"tflops": {dtype: used * ghz * fpc / 1e3 for dtype, fpc in per_cycle.items()},
            "simd": path, "ghz": ghz, "cores": used, "flops_per_cycle": per_cycle,
            "source": (f"{used} core(s) x {ghz:.3g} GHz ({clock_source}) x FLOPs per cycle "
                       f"of the {path} path ({per_cycle['float32']} fp32, "
                       f"{per_cycle['bfloat16']} bf16; 2 FMA units per core assumed on "
                       "AVX2/AVX-512)")}


def cpu_peaks(memory_gbps: float, measured: Dict[str, float], nominal: Dict[str, Any],
              source: str) -> Dict[str, Any]:
    """The peaks object from measured rates and the nominal ones. A measured rate below
    FLOOR_FRACTION of nominal is implausible: it is kept under ``measured_tflops`` and named
    in ``implausible``, and left out of ``tflops`` (the rates fractions of peak are taken
    against), so a fraction against it is null. On a CPU without bf16 arithmetic, bf16 runs at
    the fp32 FMA rate, so the bfloat16 peak is the higher of the two trusted measurements
    (``stand_ins`` says where fp32's stood in)."""
    tflops, implausible, stand_ins = {}, {}, {}
    for dtype, rate in measured.items():
        floor = FLOOR_FRACTION * nominal["tflops"].get(dtype, 0.0)
        if rate >= floor:
            tflops[dtype] = rate
        else:
            implausible[dtype] = (f"measured {rate:.3g} TFLOP/s is below 1/"
                                  f"{round(1 / FLOOR_FRACTION)} of the nominal "
                                  f"{nominal['tflops'][dtype]:.3g} TFLOP/s, also when "
                                  "measured again for longer; not used as a peak")
    native_bf16 = nominal["flops_per_cycle"]["bfloat16"] > nominal["flops_per_cycle"]["float32"]
    if not native_bf16 and "float32" in tflops and tflops["float32"] > tflops.get(
            "bfloat16", 0.0):
        tflops["bfloat16"] = tflops["float32"]
        stand_ins["bfloat16"] = "float32"
    notes = [source]
    for dtype, other in stand_ins.items():
        notes.append(f"{dtype} peak is the {other} FMA rate (no {dtype} arithmetic on the "
                     f"{nominal['simd']} path)")
    return {"memory_gbps": memory_gbps, "tflops": tflops, "source": "; ".join(notes),
            "measured_source": source, "measured_tflops": dict(measured), "nominal": nominal,
            "floor_fraction": FLOOR_FRACTION, "implausible": implausible,
            "stand_ins": stand_ins}


def _best_seconds(fn, repeats: int, min_seconds: float, warmup: bool = True,
                  cap: Optional[float] = None) -> float:
    """The fastest of at least `repeats` calls, repeating until `min_seconds` have passed,
    after `min_seconds` of warm-up calls (unless `warmup` is false: the call is warm already).
    With a `cap`, stops once `cap` seconds and 3 calls have passed even short of `repeats`,
    so a path that takes a third of a second per call costs about a second, not ten. On a
    shared machine a parallel region can wait a scheduler tick for a busy core, and a fresh
    process's first tenth of a second of matmuls can run at a tenth of the rate (seen on this
    2-core CI machine); only the fastest call after a warm-up tells the machine's rate."""
    if warmup:
        start = time.perf_counter()
        fn()
        while time.perf_counter() - start < min_seconds:
            fn()
    best, start, count = float("inf"), time.perf_counter(), 0
    while True:
        begin = time.perf_counter()
        fn()
        now = time.perf_counter()
        best = min(best, now - begin)
        count += 1
        if count >= repeats and now - start >= min_seconds:
            return best
        if cap is not None and count >= 3 and now - start >= cap:
            return best


def _matmul(dtype: str, n: int):
    import torch

    a = torch.randn(n, n).to(getattr(torch, dtype))
    b = torch.randn(n, n).to(getattr(torch, dtype))
    return lambda: torch.matmul(a, b)


def measure_cpu_peaks(llc_bytes: int, quick: bool = False,
                      nominal: Optional[Dict[str, Any]] = None,
                      matmul=_matmul) -> Dict[str, Any]:
    """This CPU's copy bandwidth and torch matmul FLOP rates, measured now, at gnomon's thread
    count: ``torch.Tensor.copy_`` of a float32 buffer of max(64 MiB, 4 x LLC) (read + write
    bytes), and square float32 and bfloat16 ``torch.matmul`` (2 n^3 FLOPs). Each is the
    fastest call of two rounds, after a warm-up as long as a round, each round at least 5
    calls (quick) or 10 over at least 0.125 s (quick) or 0.25 s (3 calls where a call takes
    longer than that). A rate below FLOOR_FRACTION of the nominal one (`nominal_cpu_peaks`)
    is measured again, twice the calls over 1 s (quick) or 2 s; if it is still below,
    `cpu_peaks` leaves it out of the peaks. `matmul(dtype, n)` builds the timed call (tests
    inject a slow one)."""
    import torch

    from gnomon.ops import num_threads

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads())
    try:
        threads = torch.get_num_threads()
        nominal = nominal or nominal_cpu_peaks(threads)
        size = max(64 << 20, 4 * llc_bytes)
        src = torch.ones(size // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        budget = 0.25 if quick else 0.5
        repeats = 5 if quick else 10
        copy_s = min(_best_seconds(lambda: dst.copy_(src), repeats, budget / 2,
                                   warmup=not r, cap=2 * budget) for r in range(2))
        del src, dst
        measured, retried = {}, []
        n = 512 if quick else 1024
        for dtype in ("float32", "bfloat16"):
            call = matmul(dtype, n)
            seconds = min(_best_seconds(call, repeats, budget / 2, warmup=not r,
                                        cap=2 * budget) for r in range(2))
            if 2 * n ** 3 / seconds / 1e12 < FLOOR_FRACTION * nominal["tflops"][dtype]:
                retried.append(dtype)
                seconds = min(seconds, _best_seconds(call, 2 * repeats, 4 * budget,
                                                     warmup=False, cap=4 * budget))
            measured[dtype] = 2 * n ** 3 / seconds / 1e12
            del call
        units = vector_unit_peaks(0.1 if quick else 0.25)
    finally:
        torch.set_num_threads(previous)
    source = (f"measured in this run on {threads} thread(s): copy_ of {size >> 20} MiB float32 "
              f"(read + write), {n}x{n} torch.matmul in float32 and bfloat16 (2 n^3 FLOPs); "
              f"each the fastest call of two rounds of {budget / 2:g} s after a warm-up")
    if retried:
        source += (f" ({', '.join(retried)} below 1/{round(1 / FLOOR_FRACTION)} of nominal: "
                   f"measured again for {4 * budget:g} s)")
    peaks = cpu_peaks(2 * size / copy_s / 1e9, measured, nominal, source)
    peaks["vector_units"] = units
    return peaks


def vector_unit_peaks(seconds: float) -> Dict[str, Any]:
    """The rates gnomon's own kernels can reach on this CPU, at gnomon's thread count: FMAs on
    registers on the kernel family the ops run, and bf16 dot products where that family has
    them (AMX tile products on the amx-bf16 family; `_C.cpu_peak_gflops`; the best of at least
    five runs over `seconds`)."""
    from gnomon import _C

    tflops = {"float32": _C.cpu_peak_gflops("fma", seconds) / 1e3}
    dot = _C.cpu_peak_gflops("bf16_dot", seconds) / 1e3
    if dot > 0:
        tflops["bfloat16"] = dot
    return {"kernel_isa": _C.cpu_kernel_isa(), "tflops": tflops,
            "source": "register-only FMA / vdpbf16ps (or AMX TDPBF16PS) loops "
                      "(_C.cpu_peak_gflops)"}


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
