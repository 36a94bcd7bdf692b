"""Resolving a hardware argument: a catalogue name, a user's JSON/YAML file, or ``host``."""

from __future__ import annotations

import functools
import os
from typing import Union

from gnomon import hardware
from gnomon.hardware import Figure, Hardware

HOST = "host"


def of_device(device: str) -> Hardware:
    """The hardware a real run on `device` runs on: `host` for ``"cpu"``, else the catalogue's
    entry for the GPU torch names there (`gnomon.hardware.from_device_name`, exact). Raises
    ValueError naming a GPU the catalogue does not list."""
    if device == "cpu":
        return host()
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    entry = hardware.from_device_name(name)
    if entry is None:
        raise ValueError(f"device: {device} is a {name!r}, which no entry of the hardware "
                         f"catalogue reports (gnomon/hardware.py, device_names); add it there "
                         f"with its datasheet figures")
    return entry


@functools.lru_cache(maxsize=1)
def host() -> Hardware:
    """This machine as the bench harness measures it (copy bandwidth and the best square
    matmul rate; measured once per process): the CPU as a `Hardware` of vendor ``host``."""
    from gnomon.bench.machine import _cpu_model, _ram_gb, measure_cpu_peaks
    from gnomon.bench.timing import last_level_cache_bytes

    peaks = measure_cpu_peaks(last_level_cache_bytes()[0], quick=True)
    source = f"gnomon.bench {peaks['source']}"
    if peaks["tflops"]:
        compute = Figure(max(peaks["tflops"].values()), source)
    else:  # every measured rate was implausibly low (gnomon.bench.machine.FLOOR_FRACTION)
        nominal = peaks["nominal"]
        compute = Figure(max(nominal["tflops"].values()),
                         f"gnomon.bench nominal rate, {nominal['source']}: the measured ones "
                         f"were implausible ({'; '.join(peaks['implausible'].values())})")
    return Hardware(
        name=HOST, vendor="host",
        bf16_tflops=compute,
        fp8_tflops=Figure(None, "a CPU has no fp8 math"),
        fp4_tflops=Figure(None, "a CPU has no fp4 math"),
        hbm_tbps=Figure(peaks["memory_gbps"] / 1000, source),
        hbm_gb=Figure(_ram_gb(), f"/proc/meminfo ({_cpu_model()})"))


def known_names() -> list:
    return [g.name for g in hardware.GPUS] + [HOST]


def resolve_hardware(spec: Union[str, os.PathLike, Hardware]) -> Hardware:
    """A `Hardware` as is; ``"host"``; a catalogue name (case, spaces and dashes ignored); or
    the path of a .json / .yaml hardware file (`gnomon.hardware.load_file`)."""
    if isinstance(spec, Hardware):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"hardware: expected a name, a file path or a Hardware, got "
                        f"{type(spec).__name__}")
    name = os.fspath(spec)
    if name.strip().lower() == HOST:
        return host()
    if name.endswith((".json", ".yaml", ".yml")):
        return hardware.load_file(name)
    try:
        return hardware.gpu(name)
    except ValueError:
        raise ValueError(f"hardware: unknown {name!r}; known: {', '.join(known_names())}, or a "
                         f".json / .yaml hardware file") from None
