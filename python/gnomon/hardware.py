"""The hardware catalogue: datasheet figures for the GPUs gnomon models, each with its source.

Data only. Numbers are dense (no sparsity), per GPU device (one GCD of an MI250X package, one
of the two GPUs of a GB200 superchip), each with its datasheet; ``None`` means the GPU has no
such math (no FP4 on Hopper or CDNA3). Nothing here is read from a
runtime: simulated execution configures hardware from this file alone (or from a user's file,
`load_file`; ``gnomon.predict`` adds ``host``, this machine as the bench harness measures it).

Interconnect: the per-direction bandwidth one GPU can drive into a ring all-reduce, in GB/s.
Datasheets quote bidirectional totals; gnomon halves them. On AMD's 8-GPU full mesh it is the
sum over the 7 links (RCCL runs several rings at once), an upper bound that measured collectives
stay below; override it with a hardware file or the predictor's efficiencies. It joins
``scale_up_gpus`` GPUs (an HGX board's 8, an NVL72 rack's 72); a collective over more of them
crosses the scale-out network, ``scale_out_gbps`` per GPU and direction (its NIC: 400 Gb/s is
50 GB/s).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class Figure:
    """One datasheet number and where it comes from. ``value`` None with ``given`` True: the
    chip has no such math (no FP8 on Ampere); with ``given`` False: nobody said (a user's file
    left the field out), and a prediction that needs it refuses."""

    value: Optional[float]
    source: str
    given: bool = True


@dataclass(frozen=True)
class Hardware:
    name: str
    vendor: str
    bf16_tflops: Figure
    fp8_tflops: Figure
    fp4_tflops: Figure  # value None where the GPU has no FP4 math
    hbm_tbps: Figure
    hbm_gb: Figure  # GB of 1e9 bytes, as the device reports its memory where that is known
    interconnect_gbps: Figure = Figure(None, "not given", given=False)  # per direction
    scale_up_gpus: Figure = Figure(None, "not given", given=False)  # one NVLink / IF domain
    scale_out_gbps: Figure = Figure(None, "not given", given=False)  # per GPU, per direction
    generation: Optional[str] = None  # one of GENERATIONS: picks the kernel-efficiency curves
    device_names: Tuple[str, ...] = ()  # exact names torch.cuda.get_device_name reports
    aliases: Tuple[str, ...] = ()  # other names gpu() accepts

    def figure(self, dtype: str) -> Optional[Figure]:
        """The peak dense TFLOP/s figure for a compute dtype name ("bfloat16", "float16",
        "fp8", "fp4"), None for another name."""
        return {"bfloat16": self.bf16_tflops, "float16": self.bf16_tflops,
                "fp8": self.fp8_tflops, "fp4": self.fp4_tflops}.get(dtype)

    def tflops(self, dtype: str) -> Optional[float]:
        """Peak dense TFLOP/s for a compute dtype name, None where the chip has no such math."""
        figure = self.figure(dtype)
        return None if figure is None else figure.value


GPU = Hardware  # the name the bench harness knows it by

# GPU generations; gnomon.predict.efficiency holds measured curves for some, borrows for others
GENERATIONS = ("ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4")

_NV_H100 = "NVIDIA H100 datasheet"
# The memory a device reports (nvidia-smi's total, torch's total_memory): what an engine's
# memory fraction multiplies. HBM stacks come in binary sizes, so a datasheet's "80 GB" is 80 GiB.
_REPORTED_AIC = "as the device reports it: aiconfigurator-core 0.12.0 systems/"
_REPORTED_NVSMI = "nvidia-smi's total, as modal-labs/modal-client#2797 lists it"
_REPORTED_H100 = f"{_REPORTED_NVSMI}: 81,559 MiB (85,520,809,984 bytes)"
_REPORTED_A100_40 = f"{_REPORTED_NVSMI}: 40,960 MiB"
_REPORTED_A100_80 = f"{_REPORTED_NVSMI}: 81,920 MiB"
_REPORTED_L40S = f"{_REPORTED_NVSMI}: 46,068 MiB"
_NV_H200 = "NVIDIA H200 datasheet"
_NV_B200 = "NVIDIA DGX B200 datasheet"
_NV_B300 = ("NVIDIA HGX B300 / DGX B300 specifications as third-party pages reproduce them "
            "(acecloud.ai's HGX B300 page, glennklockwood.com's B300 notes; dense halves of the "
            "sparse figures)")
_AMD_300 = "AMD MI300X datasheet"
_AMD_325 = "AMD MI325X datasheet"
_AMD_355 = "AMD MI355X datasheet"

H100_SXM = GPU(
    name="H100 SXM", vendor="NVIDIA",
    bf16_tflops=Figure(989, _NV_H100), fp8_tflops=Figure(1979, _NV_H100),
    fp4_tflops=Figure(None, f"{_NV_H100}: no FP4 math (MXFP4 runs weight-only)"),
    hbm_tbps=Figure(3.35, _NV_H100), hbm_gb=Figure(85.52, _REPORTED_H100),
    interconnect_gbps=Figure(450, f"{_NV_H100}: NVLink 4, 900 GB/s bidirectional"),
    scale_up_gpus=Figure(8, f"{_NV_H100}: DGX H100, 8 GPUs on NVSwitch"),
    scale_out_gbps=Figure(50, f"{_NV_H100}: DGX H100, a 400 Gb/s ConnectX-7 per GPU"),
    generation="hopper",
    device_names=("NVIDIA H100 80GB HBM3",), aliases=("H100",))
H200 = GPU(
    name="H200", vendor="NVIDIA",
    bf16_tflops=Figure(989, _NV_H200), fp8_tflops=Figure(1979, _NV_H200),
    fp4_tflops=Figure(None, f"{_NV_H200}: no FP4 math"),
    hbm_tbps=Figure(4.8, _NV_H200), hbm_gb=Figure(151.40, f"{_REPORTED_AIC}h200_sxm.yaml: 141 GiB"),
    interconnect_gbps=Figure(450, f"{_NV_H200}: NVLink 4, 900 GB/s bidirectional"),
    scale_up_gpus=Figure(8, f"{_NV_H200}: HGX H200, 8 GPUs on NVSwitch"),
    scale_out_gbps=Figure(50, f"{_NV_H200}: DGX H200, a 400 Gb/s ConnectX-7 per GPU"),
    generation="hopper",
    device_names=("NVIDIA H200",), aliases=("H200 SXM",))
B200 = GPU(
    name="B200", vendor="NVIDIA",
    bf16_tflops=Figure(2250, _NV_B200), fp8_tflops=Figure(4500, _NV_B200),
    fp4_tflops=Figure(9000, _NV_B200),
    hbm_tbps=Figure(8.0, f"{_NV_B200} (some tools use 7.7)"),
    hbm_gb=Figure(193.27, f"{_REPORTED_AIC}b200_sxm.yaml: 180 GiB (the datasheet's 180 usable; "
                          f"192 physical)"),
    interconnect_gbps=Figure(900, f"{_NV_B200}: NVLink 5, 1.8 TB/s bidirectional"),
    scale_up_gpus=Figure(8, f"{_NV_B200}: 8 GPUs on NVLink switches"),
    scale_out_gbps=Figure(50, f"{_NV_B200}: a 400 Gb/s ConnectX-7 per GPU"),
    generation="blackwell",
    device_names=("NVIDIA B200",))
B300 = GPU(
    name="B300", vendor="NVIDIA",
    bf16_tflops=Figure(2250, f"{_NV_B300}: FP16/BF16 36 PF with sparsity per 8 GPUs"),
    fp8_tflops=Figure(4500, f"{_NV_B300}: FP8 72 PF with sparsity per 8 GPUs"),
    fp4_tflops=Figure(13500, f"{_NV_B300}: FP4 108 PF dense per 8 GPUs (DGX B300)"),
    hbm_tbps=Figure(8.0, f"{_NV_B300}: HBM3e up to 8 TB/s per GPU"),
    hbm_gb=Figure(288.40, f"{_REPORTED_AIC}b300_sxm.yaml: 275,040 MiB as nvidia-smi reports "
                          f"it"),
    interconnect_gbps=Figure(900, f"{_NV_B300}: NVLink 5, 1.8 TB/s bidirectional"),
    scale_up_gpus=Figure(8, f"{_NV_B300}: 8 GPUs on NVLink switches"),
    scale_out_gbps=Figure(100, f"{_NV_B300}: an 800 Gb/s ConnectX-8 per GPU"),
    generation="blackwell")
MI300X = GPU(
    name="MI300X", vendor="AMD",
    bf16_tflops=Figure(1307.4, _AMD_300), fp8_tflops=Figure(2614.9, _AMD_300),
    fp4_tflops=Figure(None, f"{_AMD_300}: CDNA3 has no FP4"),
    hbm_tbps=Figure(5.3, _AMD_300), hbm_gb=Figure(192, _AMD_300),
    interconnect_gbps=Figure(448, f"{_AMD_300}: 7 Infinity Fabric links x 128 GB/s "
                                  f"bidirectional"),
    scale_up_gpus=Figure(8, f"{_AMD_300}: the 8-GPU platform, each GPU linked to the 7 others"),
    generation="cdna3",
    device_names=("AMD Instinct MI300X",))
MI325X = GPU(
    name="MI325X", vendor="AMD",
    bf16_tflops=Figure(1307.4, _AMD_325), fp8_tflops=Figure(2614.9, _AMD_325),
    fp4_tflops=Figure(None, f"{_AMD_325}: CDNA3 has no FP4"),
    hbm_tbps=Figure(6.0, _AMD_325), hbm_gb=Figure(256, _AMD_325),
    interconnect_gbps=Figure(448, f"{_AMD_325}: 7 Infinity Fabric links x 128 GB/s "
                                  f"bidirectional"),
    scale_up_gpus=Figure(8, f"{_AMD_325}: the 8-GPU platform, each GPU linked to the 7 others"),
    generation="cdna3",
    device_names=("AMD Instinct MI325X",))
MI355X = GPU(
    name="MI355X", vendor="AMD",
    bf16_tflops=Figure(2516.6, _AMD_355), fp8_tflops=Figure(5033, _AMD_355),
    fp4_tflops=Figure(10066, f"{_AMD_355} (MXFP4/MXFP6; the 20.1 PF headline counts sparsity)"),
    hbm_tbps=Figure(8.0, _AMD_355), hbm_gb=Figure(288, _AMD_355),
    interconnect_gbps=Figure(537.6, f"{_AMD_355}: 7 Infinity Fabric links x 153.6 GB/s "
                                    f"bidirectional"),
    scale_up_gpus=Figure(8, f"{_AMD_355}: the 8-GPU platform, each GPU linked to the 7 others"),
    generation="cdna4",
    device_names=("AMD Instinct MI355X",))

_NV_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_NV_H20 = ("NVIDIA H20 specifications as third-party pages reproduce them (no NVIDIA datasheet "
           "was at hand; FP8 is the INT8 rate, which Hopper matches)")
_NV_L40S = "NVIDIA L40S datasheet"
_NV_RTX = ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition specifications as a third-party "
           "aggregator reproduces them (dense halves of the sparse figures)")
_NV_GB200 = ("NVIDIA GB200 NVL72 specifications per GPU: the rack's sparse figures / 72, halved "
             "for dense")
_AMD_250 = "AMD Instinct MI250X datasheet (per package; gnomon models one GCD, half of it)"
_AMD_300A = "AMD Instinct MI300A datasheet"

A100_40GB = GPU(
    name="A100 SXM 40GB", vendor="NVIDIA",
    bf16_tflops=Figure(312, _NV_A100), fp8_tflops=Figure(None, f"{_NV_A100}: no FP8 math"),
    fp4_tflops=Figure(None, f"{_NV_A100}: no FP4 math"),
    hbm_tbps=Figure(1.555, _NV_A100), hbm_gb=Figure(42.95, _REPORTED_A100_40),
    interconnect_gbps=Figure(300, f"{_NV_A100}: NVLink 3, 600 GB/s bidirectional"),
    generation="ampere", device_names=("NVIDIA A100-SXM4-40GB",), aliases=("A100 40GB",))
A100_80GB = GPU(
    name="A100 SXM 80GB", vendor="NVIDIA",
    bf16_tflops=Figure(312, _NV_A100), fp8_tflops=Figure(None, f"{_NV_A100}: no FP8 math"),
    fp4_tflops=Figure(None, f"{_NV_A100}: no FP4 math"),
    hbm_tbps=Figure(2.039, _NV_A100), hbm_gb=Figure(85.90, _REPORTED_A100_80),
    interconnect_gbps=Figure(300, f"{_NV_A100}: NVLink 3, 600 GB/s bidirectional"),
    generation="ampere", device_names=("NVIDIA A100-SXM4-80GB",),
    aliases=("A100", "A100 80GB"))
H20 = GPU(
    name="H20", vendor="NVIDIA",
    bf16_tflops=Figure(148, _NV_H20), fp8_tflops=Figure(296, _NV_H20),
    fp4_tflops=Figure(None, f"{_NV_H20}: no FP4 math"),
    hbm_tbps=Figure(4.0, _NV_H20), hbm_gb=Figure(96, _NV_H20),
    interconnect_gbps=Figure(450, f"{_NV_H20}: NVLink 4, 900 GB/s bidirectional"),
    generation="hopper", device_names=("NVIDIA H20",))
L40S = GPU(
    name="L40S", vendor="NVIDIA",
    bf16_tflops=Figure(362.05, _NV_L40S), fp8_tflops=Figure(733, _NV_L40S),
    fp4_tflops=Figure(None, f"{_NV_L40S}: no FP4 math"),
    hbm_tbps=Figure(0.864, f"{_NV_L40S} (GDDR6)"), hbm_gb=Figure(48.31, _REPORTED_L40S),
    interconnect_gbps=Figure(32, f"{_NV_L40S}: no NVLink; PCIe Gen4 x16, 64 GB/s "
                                 f"bidirectional"),
    generation="ada", device_names=("NVIDIA L40S",))
RTX_PRO_6000 = GPU(
    name="RTX PRO 6000 Blackwell", vendor="NVIDIA",
    bf16_tflops=Figure(503.8, _NV_RTX), fp8_tflops=Figure(1010, _NV_RTX),
    fp4_tflops=Figure(2020, _NV_RTX),
    hbm_tbps=Figure(1.792, f"{_NV_RTX} (GDDR7)"),
    hbm_gb=Figure(102.64, f"{_REPORTED_AIC}rtx_pro_6000_server.yaml: 97,887 MiB as nvidia-smi "
                          f"reports it"),
    interconnect_gbps=Figure(64, f"{_NV_RTX}: no NVLink; PCIe Gen5 x16, 128 GB/s "
                                 f"bidirectional"),
    generation="blackwell",
    device_names=("NVIDIA RTX PRO 6000 Blackwell Workstation Edition",),
    aliases=("RTX PRO 6000",))
GB200 = GPU(
    name="GB200", vendor="NVIDIA",
    bf16_tflops=Figure(2500, _NV_GB200), fp8_tflops=Figure(5000, _NV_GB200),
    fp4_tflops=Figure(10000, _NV_GB200),
    hbm_tbps=Figure(8.0, _NV_GB200),
    hbm_gb=Figure(198.67, f"{_REPORTED_AIC}gb200.yaml: 189,471 MiB as nvidia-smi reports it"),
    interconnect_gbps=Figure(900, f"{_NV_GB200}: NVLink 5, 1.8 TB/s bidirectional"),
    scale_up_gpus=Figure(72, f"{_NV_GB200}: 72 GPUs in one NVLink domain"),
    generation="blackwell", device_names=("NVIDIA GB200",))
MI250X = GPU(
    name="MI250X", vendor="AMD",
    bf16_tflops=Figure(191.5, f"{_AMD_250}: 383 TFLOP/s per package"),
    fp8_tflops=Figure(None, f"{_AMD_250}: CDNA2 has no FP8"),
    fp4_tflops=Figure(None, f"{_AMD_250}: CDNA2 has no FP4"),
    hbm_tbps=Figure(1.6, f"{_AMD_250}: 3.2 TB/s per package"),
    hbm_gb=Figure(64, f"{_AMD_250}: 128 GB per package"),
    interconnect_gbps=Figure(200, f"{_AMD_250}: 800 GB/s of Infinity Fabric per package, "
                                  f"half per GCD, halved again per direction"),
    generation="cdna2", device_names=("AMD Instinct MI250X",), aliases=("MI250X GCD",))
MI300A = GPU(
    name="MI300A", vendor="AMD",
    bf16_tflops=Figure(980.6, _AMD_300A), fp8_tflops=Figure(1961.2, _AMD_300A),
    fp4_tflops=Figure(None, f"{_AMD_300A}: CDNA3 has no FP4"),
    hbm_tbps=Figure(5.3, _AMD_300A), hbm_gb=Figure(128, f"{_AMD_300A}: unified with the CPU"),
    interconnect_gbps=Figure(None, f"{_AMD_300A}: not found", given=False),
    generation="cdna3", device_names=("AMD Instinct MI300A",))

GPUS: Tuple[Hardware, ...] = (A100_40GB, A100_80GB, H100_SXM, H200, H20, L40S, RTX_PRO_6000,
                              B200, B300, GB200, MI250X, MI300X, MI300A, MI325X, MI355X)


def _normal(name: str) -> str:
    return " ".join(name.lower().replace("-", " ").replace("_", " ").split())


def gpu(name: str) -> Hardware:
    """The catalogue entry for `name` (case, spaces, dashes ignored: "h100-sxm", "MI300X")."""
    if isinstance(name, str):
        wanted = _normal(name)
        for entry in GPUS:
            if wanted in {_normal(n) for n in (entry.name, *entry.aliases)}:
                return entry
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)}")


def from_device_name(device_name: str) -> Optional[Hardware]:
    """The entry whose reported device name is exactly `device_name`, or None. Exact on
    purpose: an "H100 PCIe" or "H200 NVL" has other clocks and must not borrow SXM figures."""
    for entry in GPUS:
        if device_name.strip() in entry.device_names:
            return entry
    return None


_FIGURES = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_tbps", "hbm_gb", "interconnect_gbps",
            "scale_up_gpus", "scale_out_gbps")


def load_file(path: "str | os.PathLike") -> Hardware:
    """A user's hardware entry from a JSON or YAML file (YAML needs PyYAML)::

        name: MI300A               # required, as is vendor
        vendor: AMD
        bf16_tflops: 980.6         # required: bf16_tflops, hbm_tbps, hbm_gb
        fp8_tflops: 1961.2         # optional: fp8_tflops, fp4_tflops, interconnect_gbps
        hbm_tbps: 5.3
        hbm_gb: 128                # 1e9 bytes, as the device reports it (an H100: 85.52)
        interconnect_gbps: 384     # per direction
        scale_up_gpus: 4           # optional: the GPUs that interconnect joins
        scale_out_gbps: 50         # optional: per GPU and direction beyond them
        source: AMD MI300A datasheet   # applies to every figure without its own
        sources: {hbm_gb: "..."}       # optional per-figure sources

    A figure may also be ``{value: ..., source: ...}``. Errors name the file and the field."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"hardware file {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError as exc:
                raise ValueError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or "
                                 f"write the file as JSON") from exc
            raw = yaml.safe_load(text)
        elif path.endswith(".json"):
            raw = json.loads(text)
        else:
            raise ValueError(f"{path}: expected a .json, .yaml or .yml hardware file")
    except ValueError:
        raise
    except Exception as exc:  # a YAML parser error
        raise ValueError(f"{path}: cannot parse: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of fields, got {type(raw).__name__}")
    return _from_mapping(raw, path)


def _from_mapping(raw: Dict[str, Any], where: str) -> Hardware:
    known = {f.name for f in fields(Hardware)} | {"source", "sources"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(known))}")
    for key in ("name", "vendor"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{where}: {key}: expected a non-empty string")
    default_source = raw.get("source", f"user file {where}")
    sources = raw.get("sources") or {}
    if not isinstance(sources, dict):
        raise ValueError(f"{where}: sources: expected a mapping of figure name to source")
    figures = {}
    for key in _FIGURES:
        value = raw.get(key)
        source = sources.get(key, default_source)
        if isinstance(value, dict):
            value, source = value.get("value"), value.get("source", source)
        required = key in ("bf16_tflops", "hbm_tbps", "hbm_gb")
        if value is None and not required:
            if key in raw:  # written as null: the chip has none
                figures[key] = Figure(None, f"{source}: none (null in the file)")
            else:
                figures[key] = Figure(None, f"{source}: not given", given=False)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{where}: {key}: expected a positive number, got {value!r}")
        figures[key] = Figure(float(value), str(source))
    generation = raw.get("generation")
    if generation is not None and generation not in GENERATIONS:
        raise ValueError(f"{where}: generation: expected one of {', '.join(GENERATIONS)}, got "
                         f"{generation!r}")
    return Hardware(name=raw["name"].strip(), vendor=raw["vendor"].strip(),
                    generation=generation, **figures)
