"""The predictor contract: ``StepCostPredictor.predict(StepShape) -> StepCost``, or
`PredictionRefused` with its reason when the shape is outside what the predictor knows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Protocol, runtime_checkable

from .shapes import StepShape

FAMILIES = ("attention", "gemm", "moe", "elementwise", "sampling", "communication", "overhead")
PROVENANCES = ("measured", "interpolated", "fitted", "analytical")
_FAMILY_SET, _PROVENANCE_SET = frozenset(FAMILIES), frozenset(PROVENANCES)


class PredictionRefused(ValueError):
    """The shape is outside the predictor's domain; ``reason`` says how. A ValueError, as any
    other argument a function cannot take."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class StepCost:
    """A step's predicted seconds with its breakdown (exactly `FAMILIES`, summing to
    ``seconds``) and a provenance per family (one of `PROVENANCES`)."""

    seconds: float
    breakdown: Mapping[str, float]
    provenance: Mapping[str, str]

    @classmethod
    def from_parts(cls, breakdown: Mapping[str, float], provenance: Mapping[str, str]
                   ) -> "StepCost":
        """Fills absent families with 0 (provenance "analytical": nothing of that kind runs)
        and sums them into ``seconds``."""
        if not (_FAMILY_SET.issuperset(breakdown) and _FAMILY_SET.issuperset(provenance)):
            unknown = (set(breakdown) | set(provenance)) - _FAMILY_SET
            raise ValueError(f"breakdown: unknown families {sorted(unknown)}; expected "
                             f"{', '.join(FAMILIES)}")
        parts: Dict[str, float] = {f: float(breakdown.get(f, 0.0)) for f in FAMILIES}
        if not all(v >= 0 for v in parts.values()):  # every step: one pass, then the culprit
            f, v = next((f, v) for f, v in parts.items() if not v >= 0)
            raise ValueError(f"breakdown[{f!r}]: expected seconds >= 0, got {v}")
        labels = {f: provenance.get(f, "analytical") for f in FAMILIES}
        if not _PROVENANCE_SET.issuperset(labels.values()):
            f, p = next((f, p) for f, p in labels.items() if p not in _PROVENANCE_SET)
            raise ValueError(f"provenance[{f!r}]: expected one of {', '.join(PROVENANCES)}, "
                             f"got {p!r}")
        return cls(sum(parts.values()), parts, labels)


@runtime_checkable
class StepCostPredictor(Protocol):
    """Anything with ``predict(shape) -> StepCost`` (raising `PredictionRefused` outside its
    domain) and a ``name`` for reports."""

    name: str

    def predict(self, shape: StepShape) -> StepCost:
        ...
