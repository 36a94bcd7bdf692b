"""Engine profiles: the serving engine a simulation stands for (vLLM, SGLang, gnomon's own).

A profile is a partial `EngineConfig` (`EngineProfile.settings`: the engine's defaults on a
GPU: ``max_num_seqs``, ``max_num_batched_tokens``, the capacity policy, the batching, the share
of HBM it takes) plus its host overhead per step, its serving path and the name of its
all-reduce kernel (whose measured times `gnomon.predict.efficiency` holds per GPU), each with
its source, from ``data/engines.json`` or a user's JSON file of the same shape.

`EngineOverhead`: ``per_step_s + per_seq_s * sequences in the step`` of host work (scheduling,
input preparation, output processing). An engine that overlaps it with the GPU (``overlapped``:
SGLang's overlap scheduler, vLLM's async scheduling) adds only what exceeds the GPU's time.
``exposed_per_seq_s * sequences in the step`` is time per sequence that nothing hides, each
step paying it on top: fitted per engine by ``bench/fit_overhead.py`` on the fit split's busy
TPOTs, it holds the host work per sequence the overlap leaves exposed and the GPU work per
sequence the roofline misses, which measured TPOTs cannot tell apart.
The roofline reports both as the ``overhead`` family.

`ServingPath`: what a request crosses outside the step loop, between the client and the
scheduler: the API server and tokenisation on the way in (``request_s + per_prompt_token_s *
prompt tokens``), output processing and streaming on the way out (``response_s``), and
whether the engine schedules a step ahead (``schedule_ahead_steps`` 1: vLLM's async
scheduling, SGLang's and TensorRT-LLM's overlap schedulers), so that a request reaching it while
a step runs misses the step already chosen to follow. `gnomon.predict.serve.run_workload`
applies it; the metrics report what it adds to TTFT as ``serving`` (the way in and out) and
``queueing`` (the step chosen ahead).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from gnomon.engine.engine_config import (BATCHINGS, CAPACITY_POLICIES, MAX_UTILIZATION, MIXED,
                                         choice)
from gnomon.hardware import Hardware

DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "engines.json")
GIB = 1 << 30


@dataclass(frozen=True)
class EngineOverhead:
    """Host seconds per step: ``per_step_s + per_seq_s * num_seqs``, hidden behind the GPU's
    time when ``overlapped``, plus ``exposed_per_seq_s * num_seqs`` that nothing hides."""

    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    overlapped: bool = False
    exposed_per_seq_s: float = 0.0

    def __post_init__(self):
        for name in ("per_step_s", "per_seq_s", "exposed_per_seq_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise ValueError(f"overhead.{name}: expected seconds >= 0, got {v!r}")

    def seconds(self, num_seqs: int, gpu_seconds: float) -> float:
        host = self.per_step_s + self.per_seq_s * num_seqs
        hidden = max(host - gpu_seconds, 0.0) if self.overlapped else host
        return hidden + self.exposed_per_seq_s * num_seqs


@dataclass(frozen=True)
class ServingPath:
    """Seconds a request spends outside the engine's steps (module docstring)."""

    request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    response_s: float = 0.0
    schedule_ahead_steps: int = 0

    def __post_init__(self):
        for name in ("request_s", "per_prompt_token_s", "response_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    math.isfinite(v) and v >= 0):
                raise ValueError(f"serving.{name}: expected seconds >= 0, got {v!r}")
        if self.schedule_ahead_steps not in (0, 1) or isinstance(self.schedule_ahead_steps,
                                                                  bool):
            raise ValueError(f"serving.schedule_ahead_steps: expected 0 or 1, got "
                             f"{self.schedule_ahead_steps!r}")

    def ingress(self, prompt_tokens: int) -> float:
        """Seconds from the client's send to the request reaching the scheduler."""
        return self.request_s + self.per_prompt_token_s * prompt_tokens


@dataclass(frozen=True)
class EngineProfile:
    """One engine's defaults and overhead, with the sources they come from."""

    name: str
    description: str
    overhead: EngineOverhead
    max_num_seqs: Tuple[int, int]  # (on a large GPU, on a small one)
    max_num_batched_tokens: Tuple[int, int]
    large_gpu_gib: float  # a GPU of at least this much memory is "large" ...
    large_gpu_excludes: Tuple[str, ...]  # ... unless its name contains one of these
    gpu_memory_utilization: float
    sources: Dict[str, str]
    serving: ServingPath = ServingPath()
    kv_memory: str = "total"  # how the KV cache is sized: a key of KV_MEMORY
    capacity_policy: str = MAX_UTILIZATION  # the scheduler's (gnomon.engine.scheduler)
    batching: str = MIXED  # whether prompt work shares a step with decodes (the scheduler's)
    kernels: Optional[str] = None  # its measured kernels' name in efficiency.json (all-reduce, MoE)

    def is_large(self, hw: Hardware) -> bool:
        if any(word.lower() in hw.name.lower() for word in self.large_gpu_excludes):
            return False
        return hw.hbm_gb.value * 1e9 >= self.large_gpu_gib * GIB

    def settings(self, hw: Hardware) -> Dict[str, object]:
        """The partial `EngineConfig` this engine picks on `hw`: ``max_num_seqs``,
        ``max_num_batched_tokens``, the capacity policy, the batching and
        ``gpu_memory_utilization``."""
        i = 0 if self.is_large(hw) else 1
        return {"max_num_seqs": self.max_num_seqs[i],
                "max_num_batched_tokens": self.max_num_batched_tokens[i],
                "capacity_policy": self.capacity_policy, "batching": self.batching,
                "gpu_memory_utilization": self.gpu_memory_utilization}


def _profile(name: str, raw: dict, where: str) -> EngineProfile:
    try:
        over = raw["overhead"]
        return EngineProfile(
            name=name, description=str(raw["description"]),
            overhead=EngineOverhead(float(over["per_step_s"]), float(over["per_seq_s"]),
                                    bool(over["overlapped"]),
                                    float(over.get("exposed_per_seq_s", 0.0))),
            max_num_seqs=tuple(int(v) for v in raw["max_num_seqs"]),
            max_num_batched_tokens=tuple(int(v) for v in raw["max_num_batched_tokens"]),
            large_gpu_gib=float(raw["large_gpu_gib"]),
            large_gpu_excludes=tuple(raw.get("large_gpu_excludes", ())),
            gpu_memory_utilization=float(raw["gpu_memory_utilization"]),
            sources={str(k): str(v) for k, v in raw["sources"].items()},
            serving=_serving(raw.get("serving", {})), kv_memory=_kv_memory(raw),
            capacity_policy=choice("capacity_policy", raw.get("capacity_policy", MAX_UTILIZATION),
                                   CAPACITY_POLICIES),
            batching=choice("batching", raw.get("batching", MIXED), BATCHINGS),
            kernels=_kernels(raw))
    except KeyError as error:
        raise ValueError(f"{where}: engine {name!r} lacks the field {error.args[0]!r}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: engine {name!r}: {error}") from None


# How an engine sizes its KV cache from gpu_memory_utilization (kv_blocks_for_hardware)
KV_MEMORY = {
    "total": "HBM x gpu_memory_utilization minus the weights and an estimate of the "
             "activations",
    "free": "gpu_memory_utilization of what the weights and an estimate of the activations "
            "leave free",
    "static": "HBM x gpu_memory_utilization minus the weights (the rest of the HBM holds the "
              "activations)",
}


def _kv_memory(raw: dict) -> str:
    value = raw.get("kv_memory", "total")
    if value not in KV_MEMORY:
        raise ValueError("kv_memory: expected " + "; ".join(
            f"{k!r} ({v})" for k, v in KV_MEMORY.items()) + f", got {value!r}")
    return value


def _kernels(raw: dict) -> Optional[str]:
    value = raw.get("kernels")
    if value is not None and not (isinstance(value, str) and value):
        raise ValueError(f"kernels: expected the name of the engine's measured kernels (a key "
                         f"of efficiency.json's allreduce and moe tables) or null, got "
                         f"{value!r}")
    return value


def _serving(raw) -> ServingPath:
    """An engine entry's ``serving``: its fields, or ``{"as": NAME, ...}``, the shipped profile
    NAME's API-server path (its request, prompt-token and response seconds) with the fields
    given beside it, so that a profile stated to take another's fitted path follows its refits."""
    known = set(ServingPath.__dataclass_fields__)
    if isinstance(raw, dict) and "as" in raw:
        own = {name: entry["serving"] for name, entry in _shipped().items()
               if isinstance(entry.get("serving"), dict) and "as" not in entry["serving"]}
        if raw["as"] not in own:
            raise ValueError(f"serving.as: expected a shipped profile with serving figures of "
                             f"its own ({', '.join(own)}), got {raw['as']!r}")
        base = own[raw["as"]]
        raw = {**{k: base[k] for k in ("request_s", "per_prompt_token_s", "response_s")},
               **{k: v for k, v in raw.items() if k != "as"}}
    if not isinstance(raw, dict) or set(raw) - known:
        raise ValueError(f"serving: expected an object of {', '.join(sorted(known))} (or "
                         f"'as', a shipped profile's name), got {raw!r}")
    return ServingPath(**raw)


@functools.lru_cache(maxsize=1)
def _shipped() -> dict:
    """The shipped engine entries as data/engines.json holds them."""
    with open(DATA_FILE, encoding="utf-8") as f:
        return json.load(f)["engines"]


@functools.lru_cache(maxsize=1)
def profiles() -> Dict[str, EngineProfile]:
    """The shipped profiles by name."""
    return {name: _profile(name, entry, DATA_FILE) for name, entry in _shipped().items()}


def resolve_engine(spec) -> EngineProfile:
    """A profile by name (``vllm``, ``vllm-0.10``, ``sglang``, ``trtllm``, ``gnomon``) or from a
    JSON file holding one engine entry (the fields of ``data/engines.json``'s entries, plus
    ``name``)."""
    if isinstance(spec, EngineProfile):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"engine: expected a name or a .json file, got {type(spec).__name__}")
    name = os.fspath(spec)
    known = profiles()
    if name in known:
        return known[name]
    if name.endswith(".json"):
        try:
            with open(name, encoding="utf-8") as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"engine: no file {name!r}") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"engine: {name}: not valid JSON ({error})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"engine: {name}: expected a JSON object of one engine's fields")
        return _profile(str(raw.get("name", os.path.basename(name))), raw, name)
    raise ValueError(f"engine: unknown {name!r}; known: {', '.join(known)}, or a .json file")

