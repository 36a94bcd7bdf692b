"""`RooflinePredictor`: each op at the better of its compute and memory roofs, plus launches.

For every op of `opcount.step_ops`::

    time = max(flops / (peak[compute] * eff_compute[compute]), bytes / (hbm * eff_memory))
           + launches * launch_s

summed by family. Communication is a ring all-reduce, ``2 (tp - 1) / tp * bytes`` at the
per-direction interconnect bandwidth plus ``allreduce_latency_s`` per collective. The engine's
own per-step overhead is not modelled (``overhead`` is 0); `CalibratedPredictor` fits it.

Default efficiencies (REFERENCE.md): best-shape matmul rates from public GEMM sweeps, bf16 0.80
on H100 (and H200, the same silicon), 0.78 on B200, 0.60 on MI325X (and MI355X, assumed alike),
0.51 on MI300X; fp8 0.71 on H100, 0.73 on H200, the bf16 figure elsewhere; fp4 the bf16 figure.
0.8 of the HBM peak and 4 µs per kernel launch. On ``host`` (this CPU, measured by the bench
harness) the peaks already are measured rates: efficiency 1 and about 5 µs per op call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Mapping, Optional, Union

from gnomon.hardware import Hardware

from .cost import FAMILIES, PredictionRefused, StepCost
from .hardware import resolve_hardware
from .opcount import attention_ops, dense_ops
from .shapes import StepShape

_BF16 = {"H100 SXM": 0.80, "H200": 0.80, "B200": 0.78, "MI300X": 0.51, "MI325X": 0.60,
         "MI355X": 0.60}
_FP8 = {"H100 SXM": 0.71, "H200": 0.73}
ANALYTICAL = dict.fromkeys(FAMILIES, "analytical")  # every part's provenance


@dataclass(frozen=True)
class Efficiencies:
    """Achieved fractions of the datasheet peaks, and fixed costs."""

    compute: Mapping[str, float] = field(default_factory=lambda: {"bfloat16": 0.7})
    memory: float = 0.8
    launch_s: float = 4e-6
    allreduce_latency_s: float = 10e-6
    interconnect_gbps: Optional[float] = None  # overrides the hardware's figure

    @classmethod
    def default_for(cls, hw: Hardware) -> "Efficiencies":
        if hw.vendor == "host":
            return cls({"bfloat16": 1.0, "float32": 1.0}, memory=1.0, launch_s=5e-6)
        bf16 = _BF16.get(hw.name, 0.7)
        return cls({"bfloat16": bf16, "fp8": _FP8.get(hw.name, bf16), "fp4": bf16})

    @classmethod
    def coerce(cls, value, hw: Hardware) -> "Efficiencies":
        """None (the defaults), an `Efficiencies`, or a mapping of fields overriding the
        defaults (``{"memory": 0.7, "compute": {"bfloat16": 0.6}}``)."""
        base = cls.default_for(hw)
        if value is None:
            return base
        if isinstance(value, Efficiencies):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"efficiencies: expected None, Efficiencies or a mapping, got "
                            f"{type(value).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"efficiencies: unknown field(s) {sorted(unknown)}; known: "
                             f"{', '.join(sorted(known))}")
        merged = dict(value)
        if "compute" in merged:
            merged["compute"] = {**base.compute, **merged["compute"]}
        out = replace(base, **merged)
        for k, v in out.compute.items():
            if not 0 < v <= 1:
                raise ValueError(f"efficiencies.compute[{k!r}]: expected a fraction in (0, 1], "
                                 f"got {v}")
        if not 0 < out.memory <= 1:
            raise ValueError(f"efficiencies.memory: expected a fraction in (0, 1], got "
                             f"{out.memory}")
        if out.launch_s < 0 or out.allreduce_latency_s < 0:
            raise ValueError("efficiencies: launch_s and allreduce_latency_s must be >= 0")
        return out


class RooflinePredictor:
    """``RooflinePredictor(hardware, efficiencies=None)``; see the module docstring."""

    def __init__(self, hardware: Union[str, Hardware], efficiencies=None) -> None:
        self.hardware = resolve_hardware(hardware)
        self.efficiencies = Efficiencies.coerce(efficiencies, self.hardware)
        self.name = f"roofline({self.hardware.name})"
        self._dense_seconds: Dict[tuple, Dict[str, float]] = {}  # (model, T, R, tp) -> parts
        self._bytes_per_s = self.hardware.hbm_tbps.value * 1e12 * self.efficiencies.memory
        self._flops_per_s: Dict[str, float] = {}  # compute dtype -> achieved FLOP/s, cached

    def _peak_flops(self, compute: str) -> float:
        hw, eff = self.hardware, self.efficiencies
        tflops = hw.tflops(compute)
        if tflops is None:  # no such math (fp4 on Hopper / CDNA3): dequantise to bf16
            compute, tflops = "bfloat16", hw.tflops("bfloat16")
        return tflops * 1e12 * eff.compute.get(compute, eff.compute.get("bfloat16", 1.0))

    def op_seconds(self, op) -> float:
        if op.family == "communication":
            return self._allreduce_seconds(op)
        memory = op.bytes / self._bytes_per_s
        compute = 0.0
        if op.flops:
            rate = self._flops_per_s.get(op.compute)
            if rate is None:
                rate = self._flops_per_s[op.compute] = self._peak_flops(op.compute)
            compute = op.flops / rate
        return max(compute, memory) + op.launches * self.efficiencies.launch_s

    def _allreduce_seconds(self, op) -> float:
        gbps = self.efficiencies.interconnect_gbps or self.hardware.interconnect_gbps.value
        if gbps is None:
            raise PredictionRefused(f"tp > 1 needs an interconnect bandwidth and "
                                    f"{self.hardware.name} has none; pass "
                                    f"efficiencies={{'interconnect_gbps': ...}}")
        return (op.comm_bytes * self._ring_factor / (gbps * 1e9)
                + op.collectives * self.efficiencies.allreduce_latency_s)

    def predict(self, shape: StepShape) -> StepCost:
        if not isinstance(shape, StepShape):
            raise TypeError(f"shape: expected a StepShape, got {type(shape).__name__}")
        self._ring_factor = 2 * (shape.tp - 1) / shape.tp
        key = (shape.model, shape.num_tokens, shape.num_sampled, shape.tp)
        dense = self._dense_seconds.get(key)
        if dense is None:  # decode steps repeat the same few token counts
            dense = dict.fromkeys(FAMILIES, 0.0)
            for op in dense_ops(*key):
                dense[op.family] += self.op_seconds(op)
            if len(self._dense_seconds) > 65536:
                self._dense_seconds.clear()
            self._dense_seconds[key] = dense
        parts = dict(dense)
        for op in attention_ops(shape):
            parts[op.family] += self.op_seconds(op)
        return StepCost.from_parts(parts, ANALYTICAL)
