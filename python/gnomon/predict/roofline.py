"""`RooflinePredictor`: each op at the better of its compute and memory roofs, plus launches.

For every op of `opcount.step_ops`::

    time = max(flops / (peak[compute] * eff_compute), bytes / (hbm * eff_memory))
           + launches * launch_s

summed by family. ``eff_compute`` is the GPU's best-shape GEMM fraction for the op's math
(`Efficiencies.compute`) times the generation's measured curves (`gnomon.predict.efficiency`):
the GEMM factors by M and by K, the grouped-GEMM factor by tokens per expert for the MoE, and
the weight-only factor where the chip lacks the weights' math (MXFP4 on Hopper or CDNA3 runs
w4a16, FP8 on Ampere or CDNA2 w8a16, both at bf16 peak) and for a weight-only scheme on every
chip (INT4 experts with bf16 activations: w4a16 at bf16 peak). MXFP4 experts of their own
(gpt-oss's) run "w4a8": MXFP8 activations at the FP8 peak on a chip with FP4 math, else w4a16.
The MoE's two grouped GEMMs and paged attention take the engine's measured kernel instead of
the memory curve and the launch cost where it was measured on this GPU for the math they run
in (`gnomon.predict.efficiency.FittedKernel`: the fused MoE by its experts' math, decode
attention by the KV cache's dtype): their bytes stream at its fraction of the HBM peak, and
each layer adds its floor (half each to the MoE's two GEMMs); the MoE's FLOPs add their time at
its fitted fraction of the dense peak, in place of the grouped-GEMM curves (a measured MoE layer
at prefill's token counts is neither memory- nor compute-bound, and the sum of the two is what
its tables fit, `bench/kernel_tables.py`); the ops the measured attention
call performs itself (its KV cache write, TensorRT-LLM's RoPE) add nothing more. Attention
takes its compute efficiency, and its KV read efficiency where no kernel was measured, from its
own curves. Hardware of no generation (``host``, made-up units) has no curves: its factors are
1.

Communication is each collective's ring traffic (`gnomon.costing.ring_bytes`) at the
per-direction interconnect bandwidth plus ``allreduce_latency_s`` per collective; a
tensor-parallel all-reduce takes the engine's measured time instead where its all-reduce kernel
was measured on this GPU at this GPU count (`gnomon.predict.efficiency.AllReduceTable`; the
predictor's ``kernels``, an engine profile's name for its measured kernels). A collective over
more GPUs than the hardware's scale-up domain (``scale_up_gpus``) runs at its scale-out
bandwidth per GPU (``scale_out_gbps``; refused where none is given): a ring at that rate, an
all-to-all with its share to GPUs beyond the domain at that rate and the rest over the scale-up
links at once.
The engine's host work is the ``overhead`` family, from an `EngineOverhead`
(`gnomon.predict.engines`; none by default).

Best-shape fractions and the stated defaults (0.8 of the HBM peak, 4 µs per kernel launch,
0.7 of the peak where no GEMM sweep was published) live with their sources in
``data/efficiency.json``. On ``host`` (this CPU, measured by the bench harness) the peaks
already are measured rates: efficiency 1 and about 5 µs per op call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Mapping, Optional, Union

from gnomon.costing import ring_bytes
from gnomon.hardware import Hardware

from .cost import FAMILIES, PredictionRefused, StepCost
from .efficiency import (MOE_PEAK, AllReduceTable, CurveSet, FittedKernel, allreduce_table,
                         best_gemm, curves_for, defaults, fitted_kernel)
from .engines import EngineOverhead
from .hardware import resolve_hardware
from .opcount import attention_ops, dense_ops
from .shapes import StepShape

ANALYTICAL = dict.fromkeys(FAMILIES, "analytical")  # every part's provenance
_FIGURE_FIELD = {"bfloat16": "bf16_tflops", "fp8": "fp8_tflops", "fp4": "fp4_tflops"}
# the weight-only curve a chip without the weights' math runs them with, at its bf16 peak; a
# weight-only scheme ("w4a16": INT4 weights, bf16 activations) runs so on every chip
_WEIGHT_ONLY = {"fp4": "w4a16", "fp8": "w8a16", "w4a16": "w4a16", "w4a8": "w4a16"}
# mixed precision: the math the weights need the chip to have, and the math it runs in ("w4a8":
# FP4 weights, FP8 activations, at the FP8 peak where the chip has FP4 math)
_MIXED = {"w4a8": ("fp4", "fp8")}
# the maths whose weights are FP4-coded (NVFP4, MXFP4): run weight-only, a fused MoE takes the
# engine's kernel for such weights (efficiency.json's "w4a16_fp4"), not its INT4 one ("w4a16")
_FP4_CODED = ("fp4", "w4a8")


@dataclass(frozen=True)
class Efficiencies:
    """Achieved fractions of the datasheet peaks, fixed costs, and the measured curves."""

    compute: Mapping[str, float] = field(default_factory=lambda: {"bfloat16": 0.7})
    memory: float = 0.8
    launch_s: float = 4e-6
    allreduce_latency_s: float = 10e-6
    interconnect_gbps: Optional[float] = None  # overrides the hardware's figure
    curves: Optional[CurveSet] = None
    allreduce: Optional[AllReduceTable] = None  # an engine's measured all-reduce on this GPU
    moe: Optional[FittedKernel] = None  # an engine's measured fused MoE on this GPU
    attention: Optional[FittedKernel] = None  # and its decode attention

    @classmethod
    def default_for(cls, hw: Hardware, kernels: Optional[str] = None) -> "Efficiencies":
        """The GPU's figures, with the all-reduce, the fused MoE and the decode attention of
        the engine whose measured kernels are named `kernels` on it (none: the ring model and
        the curves)."""
        if hw.vendor == "host":
            return cls({"bfloat16": 1.0, "float32": 1.0}, memory=1.0, launch_s=5e-6)
        stated = defaults()
        best = {k: v for k, (v, _) in best_gemm(hw).items()}
        bf16 = best.get("bfloat16", stated["gemm_best"]["value"])
        return cls({"bfloat16": bf16, "fp8": best.get("fp8", bf16), "fp4": best.get("fp4", bf16)},
                   memory=stated["memory"]["value"], launch_s=stated["launch_s"]["value"],
                   allreduce_latency_s=stated["allreduce_latency_s"]["value"],
                   curves=curves_for(hw), allreduce=allreduce_table(hw, kernels),
                   moe=fitted_kernel("moe", hw, kernels),
                   attention=fitted_kernel("decode_attention", hw, kernels))

    @classmethod
    def coerce(cls, value, hw: Hardware, kernels: Optional[str] = None) -> "Efficiencies":
        """None (the defaults), an `Efficiencies`, or a mapping of fields overriding the
        defaults (``{"memory": 0.7, "compute": {"bfloat16": 0.6}}``). A mapping that gives the
        ring model's ``interconnect_gbps`` or ``allreduce_latency_s`` prices the all-reduces
        with them, not with the engine's measured times."""
        base = cls.default_for(hw, kernels)
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
        if {"interconnect_gbps", "allreduce_latency_s"} & set(merged):
            merged.setdefault("allreduce", None)  # the ring model's figures, given: it applies
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
    """``RooflinePredictor(hardware, efficiencies=None, overhead=None, kernels=None)``; see
    the module docstring."""

    def __init__(self, hardware: Union[str, Hardware], efficiencies=None,
                 overhead: Optional[EngineOverhead] = None,
                 kernels: Optional[str] = None) -> None:
        self.hardware = resolve_hardware(hardware)
        if kernels is not None and not isinstance(kernels, str):
            raise TypeError(f"kernels: expected the name of an engine's measured kernels or "
                            f"None, got {type(kernels).__name__}")
        self.efficiencies = Efficiencies.coerce(efficiencies, self.hardware, kernels)
        if overhead is not None and not isinstance(overhead, EngineOverhead):
            raise TypeError(f"overhead: expected an EngineOverhead or None, got "
                            f"{type(overhead).__name__}")
        self.overhead = overhead
        self.name = f"roofline({self.hardware.name})"
        self._dense_seconds: Dict[tuple, Dict[str, float]] = {}  # dense_ops' key -> parts
        self._repeated_seconds: Dict[object, float] = {}  # attention_ops' non-attention ops
        self._hbm_bytes_per_s = self.hardware.hbm_tbps.value * 1e12
        self._bytes_per_s = self._hbm_bytes_per_s * self.efficiencies.memory
        self._flops_per_s: Dict[str, tuple] = {}  # compute -> (best FLOP/s, weight-only curve)

    def _best_flops(self, compute: str) -> tuple:
        """``(best-shape FLOP/s, the weight-only curve's name or None)`` for the op's math."""
        hw, eff = self.hardware, self.efficiencies
        weights, math = _MIXED.get(compute, (compute, compute))
        figure = hw.figure(weights)
        weight_only = None
        if figure is None and compute in _WEIGHT_ONLY:  # weight-only by its scheme
            weight_only, compute = _WEIGHT_ONLY[compute], "bfloat16"
        elif figure is not None and figure.value is None:
            if not figure.given:
                raise PredictionRefused(
                    f"hardware {hw.name}: {_FIGURE_FIELD[weights]} is not given, and this "
                    f"model's {weights} weights need it; give the chip's dense peak, or null "
                    f"where it has no {weights} math (its weights then run weight-only at the "
                    f"bf16 peak)")
            weight_only, compute = _WEIGHT_ONLY[compute], "bfloat16"
        else:
            compute = math
        tflops = hw.tflops(compute)
        if tflops is None:
            raise PredictionRefused(f"hardware {hw.name}: no peak for {compute!r} math")
        best = eff.compute.get(compute, eff.compute.get("bfloat16", 1.0))
        return tflops * 1e12 * best, weight_only

    def op_seconds(self, op) -> float:
        if op.family == "communication":
            return self._collective_seconds(op)
        curves = self.efficiencies.curves
        attention = op.family == "attention" and op.flops
        grouped = op.name.startswith("fused_moe")
        measured = self._measured(op, attention, grouped)
        launch = self.efficiencies.launch_s
        if measured is not None:  # the engine's kernel: its floor per call, its memory rate
            floor, fraction, rate = measured
            memory = op.bytes / (self._hbm_bytes_per_s * fraction)
            launch = floor / 2 if grouped else floor  # the MoE layer runs two grouped GEMMs
            if rate:  # and its FLOPs at the fitted rate: the fit's three terms, summed
                return memory + op.flops / rate + op.launches * launch
        elif curves is None or not op.depth:
            memory = op.bytes / self._bytes_per_s
        else:
            if attention:
                fraction = curves["attention_decode"](op.rows)
            elif grouped:
                fraction = curves["grouped_gemm_memory"](op.rows)
            else:
                fraction = curves["gemm_memory_fp4" if op.compute == "fp4" else
                                  "gemm_memory"](op.bytes / op.launches)
            memory = op.bytes / (self._hbm_bytes_per_s * fraction)
        compute = 0.0
        if op.flops:
            cached = self._flops_per_s.get(op.compute)
            if cached is None:
                cached = self._flops_per_s[op.compute] = self._best_flops(op.compute)
            rate, weight_only = cached
            if curves is not None:
                if attention:
                    prefill = curves["attention_prefill_d64" if op.depth <= 96 else
                                     "attention_prefill_d128"]
                    rate = self.hardware.bf16_tflops.value * 1e12 * prefill(op.rows)
                else:
                    shape = curves["grouped_gemm" if grouped else "gemm"]
                    rate *= shape(op.rows) * curves["gemm_k"](op.depth)
                    if weight_only is not None:
                        rate *= curves[weight_only](op.rows)
            compute = op.flops / rate
        return max(compute, memory) + op.launches * launch

    def _included(self, spec) -> tuple:
        """The ops the engine's measured decode attention performs itself (its KV cache write,
        RoPE) where it prices this model's attention: full or windowed attention with a KV
        dtype it was measured in; else none."""
        kernel = self.efficiencies.attention
        if kernel is None or spec.config.mla is not None \
                or (spec.kv_dtype or spec.dtype) not in kernel.maths:
            return ()
        return kernel.includes

    def _measured(self, op, attention, grouped):
        """``(floor_s, memory, FLOP/s or 0)`` of the engine's measured kernel for `op`, or None:
        the fused MoE's for experts in the math they run in on this chip (weight-only where it
        lacks theirs: FP4-coded weights on their own kernel, ``w4a16_fp4``, not INT4's), decode
        attention's for the KV cache's dtype."""
        eff = self.efficiencies
        if attention and eff.attention is not None and op.kv_dtype:
            return eff.attention.maths.get(op.kv_dtype)  # its compute is 0: no FLOP term
        if not grouped or eff.moe is None:
            return None
        cached = self._flops_per_s.get(op.compute)
        if cached is None:
            cached = self._flops_per_s[op.compute] = self._best_flops(op.compute)
        math_ = cached[1] or op.compute
        if math_ == "w4a16" and op.compute in _FP4_CODED:
            math_ = "w4a16_fp4"
        fit = eff.moe.maths.get(math_)
        if fit is None:
            return None
        floor, memory, compute = fit
        peak = self.hardware.tflops(MOE_PEAK[math_]) if compute else None  # parse checked it
        return floor, memory, (peak * 1e12 * compute if peak else 0.0)

    def _collective_seconds(self, op) -> float:
        table = self.efficiencies.allreduce
        if table is not None and op.name == "all_reduce":
            payload = op.comm_bytes / op.collectives / ring_bytes("all_reduce", 1.0, op.ranks)
            seconds = table.seconds(op.ranks, payload)
            if seconds is not None:
                return op.collectives * seconds
        hw = self.hardware
        gbps = self.efficiencies.interconnect_gbps or hw.interconnect_gbps.value
        if gbps is None:
            raise PredictionRefused(f"tp > 1 needs an interconnect bandwidth and "
                                    f"{hw.name} has none; pass "
                                    f"efficiencies={{'interconnect_gbps': ...}}")
        latency = op.collectives * self.efficiencies.allreduce_latency_s
        domain = hw.scale_up_gpus.value
        if domain is None or op.ranks <= domain:
            return op.comm_bytes / (gbps * 1e9) + latency
        out = hw.scale_out_gbps.value
        if out is None:
            raise PredictionRefused(
                f"{op.name} over {op.ranks} GPUs: wider than {hw.name}'s {domain:g}-GPU "
                f"scale-up domain, and {hw.name} has no scale-out bandwidth (scale_out_gbps)")
        if op.name != "all_to_all":  # a ring: every rank's traffic crosses its NIC's link
            return op.comm_bytes / (out * 1e9) + latency
        # an all-to-all sends (domain - 1) of its ranks - 1 peers' shares over the scale-up
        # links and the rest over the scale-out network, both at once
        near = (domain - 1) / (op.ranks - 1)
        return max(op.comm_bytes * near / (gbps * 1e9),
                   op.comm_bytes * (1 - near) / (out * 1e9)) + latency

    def predict(self, shape: StepShape) -> StepCost:
        if not isinstance(shape, StepShape):
            raise TypeError(f"shape: expected a StepShape, got {type(shape).__name__}")
        key = (shape.model, shape.num_tokens, shape.num_sampled, shape.tp, shape.ep, shape.dp,
               shape.dp_tokens)
        included = self._included(shape.model)
        dense = self._dense_seconds.get(key)
        if dense is None:  # decode steps repeat the same few token counts
            dense = dict.fromkeys(FAMILIES, 0.0)
            for op in dense_ops(*key):
                if op.name not in included:
                    dense[op.family] += self.op_seconds(op)
            if len(self._dense_seconds) > 65536:
                self._dense_seconds.clear()
            self._dense_seconds[key] = dense
        parts = dict(dense)
        repeated = self._repeated_seconds
        for op in attention_ops(shape):
            if op.name in included:
                continue
            if op.family == "attention":  # depends on the contexts, new every step
                parts["attention"] += self.op_seconds(op)
                continue
            seconds = repeated.get(op)  # MLA's absorbed GEMMs: by the decode count alone
            if seconds is None:
                if len(repeated) > 65536:
                    repeated.clear()
                seconds = repeated[op] = self.op_seconds(op)
            parts[op.family] += seconds
        if self.overhead is not None:
            parts["overhead"] = self.overhead.seconds(shape.num_seqs, sum(parts.values()))
        # every family, each a sum of non-negative seconds: from_parts' checks hold already
        return StepCost(sum(parts.values()), parts, ANALYTICAL)
