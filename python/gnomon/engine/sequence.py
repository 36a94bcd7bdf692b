"""Request and sequence state, as the scheduler keeps it.

A `Request` is what the user asked for: a prompt, `SamplingParams`, an arrival time. It owns one
`Sequence` per sample (``n``): before its prompt is done a request with ``n > 1`` has only sample
0 (the parent); the other samples are forked from it (sharing its KV blocks) once the prompt is
computed up to its last token.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import replace
from typing import List, NamedTuple, Optional, Tuple

from .batch import RequestId
from .sampling_params import SamplingParams

FINISH_LENGTH = "length"  # max_tokens reached
FINISH_STOP = "stop"      # an EOS id (unless ignore_eos) or one of stop_token_ids was sampled
FINISH_ABORT = "abort"    # aborted by the caller

_MASK63 = (1 << 63) - 1


def sample_seed(seed: Optional[int], sample_index: int) -> Optional[int]:
    """The seed of sample ``sample_index`` of a request seeded with ``seed``.

    Sample 0 keeps the request's seed (so ``n=1`` and ``n>1``'s first sample agree); sample i > 0
    gets a splitmix64 mix of (seed, i): deterministic, independent of the batch and of preemption.
    """
    if seed is None or sample_index == 0:
        return seed
    x = (seed * 0x9E3779B97F4A7C15 + sample_index * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & _MASK63


class SampleDelta(NamedTuple):
    """What one sample of a request gained in one step: its new token ids, the finish reason
    when it finished, ``finished`` when this completed the whole request, and the new tokens'
    logprobs entry when requested."""

    request_id: RequestId
    index: int
    new_token_ids: Tuple[int, ...]
    finish_reason: Optional[str]
    finished: bool
    logprobs: Optional[object] = None


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One sample's token ids and progress.

    ``token_ids`` is the prompt followed by the generated tokens; ``token_times`` holds the clock
    at which each generated token came out (float64). ``num_computed_tokens`` of them
    have KV in the cache. ``prefill_target`` is how far the current prefill runs: the whole of
    ``token_ids`` at (re)admission, except for an unforked ``n > 1`` parent, which stops one token
    short so that every sample computes the prompt's last token itself and samples its own first
    token. ``num_known`` counts the token ids the allocator has been told. Compiled, this is a
    C struct (its attributes are declared in sequence.pxd, so a new one goes there too).
    """

    def __init__(self, seq_id: int, request: "Request", sample_index: int,
                 token_ids: List[int]) -> None:
        self.seq_id = seq_id
        self.request = request
        self.sample_index = sample_index
        self.params: SamplingParams = request.sample_params[sample_index]
        self.token_ids: List[int] = token_ids
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.prefill_target = len(token_ids)
        self.num_known = 0
        self.status = SequenceStatus.WAITING
        self.finish_reason: Optional[str] = None
        self.output_logprobs: List[object] = []
        self.num_preemptions = 0
        self.token_times = array("d")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> Tuple[int, ...]:
        return tuple(self.token_ids[self.num_prompt_tokens:])

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_unforked_parent(self) -> bool:
        """Sample 0 of an ``n > 1`` request whose siblings do not exist yet."""
        return len(self.request.sequences) < self.request.params.n

    @property
    def width(self) -> int:
        """How many sequences this one stands for in the ``max_num_seqs`` cap."""
        return self.request.params.n if self.is_unforked_parent else 1

    @property
    def is_decoding(self) -> bool:
        """Past its (re)computed prompt: one sampled token left to compute."""
        return self.num_computed_tokens >= self.prefill_target and \
            self.num_computed_tokens == len(self.token_ids) - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def reset_for_recompute(self) -> None:
        """After preemption: nothing is cached; the next prefill recomputes every token so far."""
        self.num_computed_tokens = 0
        self.num_known = 0
        self.prefill_target = len(self.token_ids) - (1 if self.is_unforked_parent else 0)
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def __repr__(self) -> str:
        return (f"Sequence(seq_id={self.seq_id}, request_id={self.request.request_id!r}, "
                f"sample={self.sample_index}, tokens={len(self.token_ids)}, "
                f"computed={self.num_computed_tokens}, status={self.status.value})")


class Request:
    """A user request: its prompt, params, arrival, samples and timing.

    ``sequences`` lists the samples that exist, by sample index. The metrics are times on the
    scheduler's clock: ``arrival_time``, ``first_scheduled_time`` (first step that computes any of
    it), ``first_token_time`` (first sampled token of any sample) and ``finish_time`` (all samples
    finished).
    """

    def __init__(self, request_id: RequestId, prompt_token_ids: Tuple[int, ...],
                 params: SamplingParams, arrival_time: float, order: int) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = arrival_time
        self.order = order
        self.sample_params: Tuple[SamplingParams, ...] = tuple(
            params if i == 0 else replace(params, seed=sample_seed(params.seed, i))
            for i in range(params.n))
        self.sequences: List[Sequence] = []
        self.first_scheduled_time: Optional[float] = None
        self.first_token_time: Optional[float] = None
        self.finish_time: Optional[float] = None
        self.prompt_logits = None  # params.prompt_logits: the logits the runner returned

    @property
    def finished(self) -> bool:
        return len(self.sequences) == self.params.n and all(s.is_finished for s in self.sequences)

    def outputs(self) -> Tuple[Tuple[Tuple[int, ...], Optional[str]], ...]:
        """Per sample index: (generated token ids, finish reason or None); n entries."""
        out = [((), None)] * self.params.n
        for s in self.sequences:
            out[s.sample_index] = (s.output_token_ids, s.finish_reason)
        return tuple(out)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={len(self.prompt_token_ids)} tokens, "
                f"n={self.params.n}, finished={self.finished})")
