"""The hardware catalogue: datasheet figures for the GPUs gnomon models, each with its source.

Data only. Numbers are dense (no sparsity), per GPU, as listed in ``shared/REFERENCE.md``;
``None`` means the GPU has no such math (no FP4 on Hopper or CDNA3). Nothing here is read from a
runtime: simulated execution configures hardware from this file alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Figure:
    """One datasheet number and where it comes from."""

    value: Optional[float]
    source: str


@dataclass(frozen=True)
class GPU:
    name: str
    vendor: str
    bf16_tflops: Figure
    fp8_tflops: Figure
    fp4_tflops: Figure  # value None where the GPU has no FP4 math
    hbm_tbps: Figure
    hbm_gb: Figure
    device_names: Tuple[str, ...] = ()  # exact names torch.cuda.get_device_name reports
    aliases: Tuple[str, ...] = ()  # other names gpu() accepts

    def tflops(self, dtype: str) -> Optional[float]:
        """Peak dense TFLOP/s for a compute dtype name ("bfloat16", "float16", "fp8", "fp4")."""
        figure = {"bfloat16": self.bf16_tflops, "float16": self.bf16_tflops,
                  "fp8": self.fp8_tflops, "fp4": self.fp4_tflops}.get(dtype)
        return None if figure is None else figure.value


_NV_H100 = "NVIDIA H100 datasheet"
_NV_H200 = "NVIDIA H200 datasheet"
_NV_B200 = "NVIDIA DGX B200 datasheet"
_AMD_300 = "AMD MI300X datasheet"
_AMD_325 = "AMD MI325X datasheet"
_AMD_355 = "AMD MI355X datasheet"

H100_SXM = GPU(
    name="H100 SXM", vendor="NVIDIA",
    bf16_tflops=Figure(989, _NV_H100), fp8_tflops=Figure(1979, _NV_H100),
    fp4_tflops=Figure(None, f"{_NV_H100}: no FP4 math (MXFP4 runs weight-only)"),
    hbm_tbps=Figure(3.35, _NV_H100), hbm_gb=Figure(80, _NV_H100),
    device_names=("NVIDIA H100 80GB HBM3",), aliases=("H100",))
H200 = GPU(
    name="H200", vendor="NVIDIA",
    bf16_tflops=Figure(989, _NV_H200), fp8_tflops=Figure(1979, _NV_H200),
    fp4_tflops=Figure(None, f"{_NV_H200}: no FP4 math"),
    hbm_tbps=Figure(4.8, _NV_H200), hbm_gb=Figure(141, _NV_H200),
    device_names=("NVIDIA H200",), aliases=("H200 SXM",))
B200 = GPU(
    name="B200", vendor="NVIDIA",
    bf16_tflops=Figure(2250, _NV_B200), fp8_tflops=Figure(4500, _NV_B200),
    fp4_tflops=Figure(9000, _NV_B200),
    hbm_tbps=Figure(8.0, f"{_NV_B200} (some tools use 7.7)"),
    hbm_gb=Figure(180, f"{_NV_B200}: 180 usable (192 physical)"),
    device_names=("NVIDIA B200",))
MI300X = GPU(
    name="MI300X", vendor="AMD",
    bf16_tflops=Figure(1307.4, _AMD_300), fp8_tflops=Figure(2614.9, _AMD_300),
    fp4_tflops=Figure(None, f"{_AMD_300}: CDNA3 has no FP4"),
    hbm_tbps=Figure(5.3, _AMD_300), hbm_gb=Figure(192, _AMD_300),
    device_names=("AMD Instinct MI300X",))
MI325X = GPU(
    name="MI325X", vendor="AMD",
    bf16_tflops=Figure(1307.4, _AMD_325), fp8_tflops=Figure(2614.9, _AMD_325),
    fp4_tflops=Figure(None, f"{_AMD_325}: CDNA3 has no FP4"),
    hbm_tbps=Figure(6.0, _AMD_325), hbm_gb=Figure(256, _AMD_325),
    device_names=("AMD Instinct MI325X",))
MI355X = GPU(
    name="MI355X", vendor="AMD",
    bf16_tflops=Figure(2516.6, _AMD_355), fp8_tflops=Figure(5033, _AMD_355),
    fp4_tflops=Figure(10066, f"{_AMD_355} (MXFP4/MXFP6; the 20.1 PF headline counts sparsity)"),
    hbm_tbps=Figure(8.0, _AMD_355), hbm_gb=Figure(288, _AMD_355),
    device_names=("AMD Instinct MI355X",))

GPUS: Tuple[GPU, ...] = (H100_SXM, H200, B200, MI300X, MI325X, MI355X)


def _normal(name: str) -> str:
    return " ".join(name.lower().replace("-", " ").replace("_", " ").split())


def gpu(name: str) -> GPU:
    """The catalogue entry for `name` (case, spaces, dashes ignored: "h100-sxm", "MI300X")."""
    if isinstance(name, str):
        wanted = _normal(name)
        for entry in GPUS:
            if wanted in {_normal(n) for n in (entry.name, *entry.aliases)}:
                return entry
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(g.name for g in GPUS)}")


def from_device_name(device_name: str) -> Optional[GPU]:
    """The entry whose reported device name is exactly `device_name`, or None. Exact on
    purpose: an "H100 PCIe" or "H200 NVL" has other clocks and must not borrow SXM figures."""
    for entry in GPUS:
        if device_name.strip() in entry.device_names:
            return entry
    return None
