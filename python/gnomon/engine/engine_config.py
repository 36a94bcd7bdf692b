"""`EngineConfig`: every setting of an engine, real or simulated, defined and checked here.

`LLM`, `LLMEngine`, the scheduler, the runner builder and `gnomon simulate`'s simulated engine
read their settings from one frozen `EngineConfig`; a new setting is a field, its check in
`__post_init__`, and its use. An engine profile of the simulator (`gnomon.predict.engines`) is
a partial one. The fields: the scheduler's (a step's sequences and tokens, at least one token
per sequence; ``max_model_len``, None: the model's maximum position; prefix caching; the
capacity policy, vLLM's ``max_utilization`` or TensorRT-LLM's ``guaranteed_no_evict``,
TensorRT-LLM's batch waiting, and the batching, ``mixed`` (prompt work shares a step with the
running decodes: vLLM, TensorRT-LLM) or ``prefill_first`` (a step with prompt work to do runs it
alone: SGLang); SGLang's ``scheduler_recv_interval``, which only a simulation runs
(`gnomon.predict.serve.run_workload`)); the KV cache's (hybrid KV, and its size: ``num_kv_blocks``,
``kv_cache_bytes`` per rank, or ``gpu_memory_utilization`` of a simulated GPU, at most one);
the parallel layout (tensor; expert and attention data parallelism and TensorRT-LLM's
attention-DP balance, which only a simulation prices); speculative decoding, which only a
simulation runs (``num_speculative_tokens`` draft tokens verified with each decode, each
accepted with ``draft_acceptance_rate`` when the ones before it were: the scheduler's policy,
`gnomon.predict.simulated.SimulatedRunner`'s drafter); and ``dtype`` ("auto": the
checkpoint's), ``device`` and ``seed`` (unseeded random requests draw from it; None: random).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Optional

MAX_UTILIZATION = "max_utilization"
GUARANTEED_NO_EVICT = "guaranteed_no_evict"
CAPACITY_POLICIES = (MAX_UTILIZATION, GUARANTEED_NO_EVICT)
MIXED = "mixed"
PREFILL_FIRST = "prefill_first"
BATCHINGS = (MIXED, PREFILL_FIRST)
DTYPES = ("auto", "float32", "float16", "bfloat16")


def _int(name: str, value, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}"
                         + (" or None" if optional else "") + f", got {value!r}")


def _bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")


def choice(name: str, value, choices) -> str:
    """`value` if it is one of `choices`, else a ValueError naming `name` and them."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def _fraction(name: str, value, low_open: bool, optional: bool = False) -> None:
    if optional and value is None:
        return
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (0 < value if low_open else 0 <= value) and value <= 1)
    if not ok:
        span = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name}: expected a fraction in {span}"
                         + (" or None" if optional else "") + f", got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's settings (module docstring). Build it from keyword arguments, or from a
    mapping with `from_mapping`, which names what it does not know."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None
    enable_prefix_caching: bool = True
    capacity_policy: str = MAX_UTILIZATION
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    batching: str = MIXED
    scheduler_recv_interval: int = 1
    enable_hybrid_kv: bool = True
    num_kv_blocks: Optional[int] = None
    kv_cache_bytes: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    data_parallel_size: int = 1
    attention_dp_balance: bool = False
    attention_dp_timeout_iters: int = 50
    attention_dp_batching_wait_iters: int = 10
    num_speculative_tokens: int = 0
    draft_acceptance_rate: float = 0.0
    dtype: str = "auto"
    device: str = "cpu"
    seed: Optional[int] = 0

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                     "scheduler_recv_interval", "tensor_parallel_size", "expert_parallel_size",
                     "data_parallel_size"):
            _int(name, getattr(self, name), 1)
        for name in ("max_model_len", "num_kv_blocks", "kv_cache_bytes"):
            _int(name, getattr(self, name), 1, optional=True)
        for name in ("batch_wait_timeout_iters", "attention_dp_timeout_iters",
                     "attention_dp_batching_wait_iters", "num_speculative_tokens"):
            _int(name, getattr(self, name), 0)
        _int("seed", self.seed, 0, optional=True)
        for name in ("enable_prefix_caching", "enable_hybrid_kv", "attention_dp_balance"):
            _bool(name, getattr(self, name))
        per_decode = 1 + self.num_speculative_tokens
        if self.max_num_batched_tokens < self.max_num_seqs * per_decode:
            raise ValueError(f"max_num_batched_tokens: expected >= max_num_seqs "
                             f"({self.max_num_seqs}) x {per_decode} tokens per decode "
                             f"(1 + num_speculative_tokens) so every running decode fits a "
                             f"step, got {self.max_num_batched_tokens}")
        for name, choices in (("capacity_policy", CAPACITY_POLICIES), ("batching", BATCHINGS)):
            choice(name, getattr(self, name), choices)
        _fraction("batch_wait_max_tokens_ratio", self.batch_wait_max_tokens_ratio, False)
        _fraction("gpu_memory_utilization", self.gpu_memory_utilization, True, optional=True)
        _fraction("draft_acceptance_rate", self.draft_acceptance_rate, False)
        if self.draft_acceptance_rate and not self.num_speculative_tokens:
            raise ValueError(f"draft_acceptance_rate: expected 0 without speculative decoding "
                             f"(num_speculative_tokens 0), got {self.draft_acceptance_rate!r}")
        sized = [n for n in ("num_kv_blocks", "kv_cache_bytes", "gpu_memory_utilization")
                 if getattr(self, n) is not None]
        if len(sized) > 1:
            raise ValueError(f"{', '.join(sized)}: the KV cache is sized by one of them; pass "
                             f"one")
        # a torch.dtype is taken by its name, without importing torch
        dtype = self.dtype if isinstance(self.dtype, str) else str(self.dtype).replace(
            "torch.", "")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(map(repr, DTYPES))} or that "
                             f"torch.dtype, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {self.device!r}")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any], where: str = "engine settings",
                     base: Optional["EngineConfig"] = None) -> "EngineConfig":
        """`base` (default: the defaults) with `settings` over it; a key that is no field is
        refused, named with `where`."""
        check_fields(settings, where)
        return replace(base or cls(), **settings)

    def replace(self, **settings) -> "EngineConfig":
        """This config with `settings` over it (validated again)."""
        return self.from_mapping(settings, "settings", self)

    def to_json(self) -> dict:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(EngineConfig))


def check_fields(settings: Mapping[str, Any], where: str = "engine settings") -> None:
    """Refuses `settings` that are not a mapping of `EngineConfig` fields, naming the rest."""
    if not isinstance(settings, Mapping):
        raise ValueError(f"{where}: expected a mapping of EngineConfig fields, got "
                         f"{type(settings).__name__}")
    unknown = sorted(set(settings) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown {unknown}; expected fields of EngineConfig: "
                         f"{', '.join(FIELDS)}")
