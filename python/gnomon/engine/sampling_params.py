"""SamplingParams: how one request's tokens are chosen and when it stops."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping.

    ``temperature=0`` is greedy; ``top_k=0`` disables top-k; ``top_p=1`` and ``min_p=0`` disable
    nucleus and min-p filtering. A request with a ``seed`` draws its tokens from its own generator,
    so they do not depend on which other requests share its batch, or on preemption. ``n > 1``
    samples n completions of the prompt (they share its KV through the allocator's fork).
    ``logprobs=k`` returns the sampled token's logprob and the top k alternatives per position.
    Generation stops after ``max_tokens`` tokens, at an EOS id (unless ``ignore_eos``) or at any of
    ``stop_token_ids``. ``prompt_logits`` asks for the float32 logits at the prompt's last
    position instead of a sample: the request finishes after its prefill with no token
    (reason "length"), its logits in `Request.prompt_logits` (`gnomon.LLM.score`).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop_token_ids: Tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: Optional[int] = None
    prompt_logits: bool = False

    def __post_init__(self) -> None:
        def is_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def is_real(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: expected an integer >= 1, got {self.max_tokens!r}")
        if not is_real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature: expected a finite number >= 0, got {self.temperature!r}")
        if not is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k: expected an integer >= 0 (0 disables), got {self.top_k!r}")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if not is_real(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p: expected a number in [0, 1], got {self.min_p!r}")
        if self.seed is not None and not is_int(self.seed):
            raise ValueError(f"seed: expected None or an integer, got {self.seed!r}")
        stop = tuple(self.stop_token_ids)
        if not all(is_int(t) and t >= 0 for t in stop):
            raise ValueError(f"stop_token_ids: expected non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos: expected a bool, got {self.ignore_eos!r}")
        if not is_int(self.n) or self.n < 1:
            raise ValueError(f"n: expected an integer >= 1, got {self.n!r}")
        if self.logprobs is not None and (not is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs: expected None or an integer >= 0, got {self.logprobs!r}")
        if not isinstance(self.prompt_logits, bool):
            raise ValueError(f"prompt_logits: expected a bool, got {self.prompt_logits!r}")
        if self.prompt_logits and self.n != 1:
            raise ValueError(f"prompt_logits: a request returning its prompt's logits has one "
                             f"sample; got n={self.n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
