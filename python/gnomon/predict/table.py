"""`TablePredictor`: a measured grid of step times, interpolated in log space.

The grid's axes are any of ``num_seqs``, ``num_tokens`` and ``context_tokens`` (the tokens
cached before the step, summed over its sequences), each a strictly increasing list of
non-negative values. Every grid point holds a breakdown (family -> seconds, families from
`cost.FAMILIES`, absent ones 0). A step is placed on the grid by its coordinates and each
family is interpolated multilinearly in ``log(1 + axis)`` and ``log(seconds)`` (linearly where a
corner is 0). A point on the grid is ``measured``; between points ``interpolated``; outside it
the predictor refuses.

File (JSON)::

    {"schema_version": 1, "kind": "gnomon.predict.table", "model": "...", "source": "...",
     "axes": {"num_tokens": [1, 16, 256], "context_tokens": [0, 1024, 16384]},
     "points": [{"at": [1, 0], "breakdown": {"gemm": 0.0012, ...}}, ...]}

with one point per combination of axis values.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Dict, List, Mapping, Sequence

import numpy as np

from gnomon import documents

from .cost import FAMILIES, PredictionRefused, StepCost
from .shapes import StepShape

SCHEMA_VERSION = 1
ACCEPTED_VERSIONS = (1,)
KIND = "gnomon.predict.table"
AXES = ("num_seqs", "num_tokens", "context_tokens")


def coordinate(shape: StepShape, axis: str) -> int:
    if axis == "num_seqs":
        return shape.num_seqs
    if axis == "num_tokens":
        return shape.num_tokens
    return sum(c for _, c in shape.requests)


class TablePredictor:
    """``TablePredictor(axes, breakdowns)``: `axes` maps axis name -> increasing values;
    `breakdowns` has the grid's shape (nested lists in axis order) of family -> seconds."""

    def __init__(self, axes: Mapping[str, Sequence[float]], breakdowns, *, name: str = "table",
                 info: Mapping = ()) -> None:
        if not axes:
            raise ValueError(f"axes: expected at least one of {', '.join(AXES)}")
        unknown = [a for a in axes if a not in AXES]
        if unknown:
            raise ValueError(f"axes: unknown {unknown}; known: {', '.join(AXES)}")
        self.axes = {a: np.asarray(v, dtype=float) for a, v in axes.items()}
        for a, v in self.axes.items():
            if v.ndim != 1 or len(v) < 1 or (v < 0).any() or (np.diff(v) <= 0).any():
                raise ValueError(f"axes[{a!r}]: expected strictly increasing values >= 0")
        shape = tuple(len(v) for v in self.axes.values())
        grid = np.zeros(shape + (len(FAMILIES),))
        for index in itertools.product(*(range(n) for n in shape)):
            cell = breakdowns
            for i in index:
                cell = cell[i]
            if not isinstance(cell, Mapping):
                raise ValueError(f"breakdowns{list(index)}: expected a mapping family -> "
                                 f"seconds")
            bad = set(cell) - set(FAMILIES)
            if bad:
                raise ValueError(f"breakdowns{list(index)}: unknown families {sorted(bad)}")
            for j, fam in enumerate(FAMILIES):
                value = float(cell.get(fam, 0.0))
                if not value >= 0 or math.isinf(value):
                    raise ValueError(f"breakdowns{list(index)}[{fam!r}]: expected finite "
                                     f"seconds >= 0, got {value}")
                grid[index + (j,)] = value
        self.grid = grid
        self.name = name
        self.info = dict(info)

    def predict(self, shape: StepShape) -> StepCost:
        if not isinstance(shape, StepShape):
            raise TypeError(f"shape: expected a StepShape, got {type(shape).__name__}")
        if (shape.ep, shape.dp) != (1, 1):
            raise PredictionRefused(f"ep = {shape.ep}, dp = {shape.dp}: a table's steps carry "
                                    f"no expert or data parallelism")
        lows, weights, exact = [], [], True
        for axis, values in self.axes.items():
            x = coordinate(shape, axis)
            if x < values[0] or x > values[-1]:
                raise PredictionRefused(f"{axis} = {x} is outside the table's "
                                        f"[{values[0]:g}, {values[-1]:g}]")
            i = min(int(np.searchsorted(values, x, side="right")) - 1, len(values) - 2)
            i = max(i, 0)
            if len(values) == 1:
                lows.append(0)
                weights.append(0.0)
                continue
            lo, hi = math.log1p(values[i]), math.log1p(values[i + 1])
            w = (math.log1p(x) - lo) / (hi - lo)
            exact &= w in (0.0, 1.0)
            lows.append(i)
            weights.append(w)
        parts = {}
        for j, fam in enumerate(FAMILIES):
            corners, cw = [], []
            for offsets in itertools.product((0, 1), repeat=len(lows)):
                weight = 1.0
                index = []
                for (low, w, off) in zip(lows, weights, offsets):
                    weight *= w if off else 1.0 - w
                    index.append(min(low + off, self.grid.shape[len(index)] - 1))
                if weight:
                    corners.append(self.grid[tuple(index) + (j,)])
                    cw.append(weight)
            corners, cw = np.array(corners), np.array(cw)
            if (corners > 0).all():
                parts[fam] = float(np.exp(np.dot(cw, np.log(corners))))
            else:
                parts[fam] = float(np.dot(cw, corners))
        label = "measured" if exact else "interpolated"
        return StepCost.from_parts(parts, {f: label for f in FAMILIES})

    # ---------------------------------------------------------------- files
    def to_json(self) -> dict:
        points = []
        for index in itertools.product(*(range(len(v)) for v in self.axes.values())):
            at = [float(v[i]) for v, i in zip(self.axes.values(), index)]
            row = self.grid[index]
            points.append({"at": at, "breakdown": {f: float(row[j])
                                                   for j, f in enumerate(FAMILIES) if row[j]}})
        return {"schema_version": SCHEMA_VERSION, "kind": KIND, "name": self.name,
                "info": self.info, "axes": {a: v.tolist() for a, v in self.axes.items()},
                "points": points}

    def save(self, path) -> None:
        documents.dump(self.to_json(), path)

    @classmethod
    def load(cls, path) -> "TablePredictor":
        doc = documents.load(path, KIND, ACCEPTED_VERSIONS)
        path = os.fspath(path)
        try:
            axes = {a: list(v) for a, v in doc["axes"].items()}
            lookup: Dict[tuple, dict] = {tuple(float(x) for x in p["at"]): p["breakdown"]
                                         for p in doc["points"]}
            nested = _nest(axes, lookup)
            return cls(axes, nested, name=doc.get("name", os.path.basename(path)),
                       info=doc.get("info") or {})
        except (KeyError, TypeError, AttributeError) as exc:
            raise documents.DocumentError(f"{path}: malformed table ({exc!r})") from None
        except ValueError as exc:
            raise documents.DocumentError(f"{path}: {exc}") from None


def _nest(axes: Dict[str, List[float]], lookup: Dict[tuple, dict], prefix=()):
    names = list(axes)
    depth = len(prefix)
    if depth == len(names):
        if prefix not in lookup:
            raise ValueError(f"no point at {dict(zip(names, prefix))}")
        return lookup[prefix]
    return [_nest(axes, lookup, prefix + (float(v),)) for v in axes[names[depth]]]
