"""The scheduler-to-runner contract: `ScheduledBatch` in, `StepOutput` back (DESIGN.md).

A batch is a frozen dataclass made only of tuples (`ScheduledSequence` is a named tuple: the
engine builds one per running sequence per step, and a tuple is built several times faster than
a frozen dataclass), ints, strings and the frozen `SamplingParams`, so two batches compare with
``==`` and nothing in one can be changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional, Tuple, Union

from .sampling_params import SamplingParams

RequestId = Union[str, int]


class ScheduledSequence(NamedTuple):
    """One sequence's share of a step: what changed since the runner last saw it.

    ``token_ids`` are the tokens computed this step; they sit at positions
    ``num_computed_tokens .. num_computed_tokens + len(token_ids) - 1``, and
    ``num_computed_tokens`` tokens already have KV in the cache before the step.

    The block tables travel as deltas, one per KV-cache group in the allocator's group order
    (a token's slot in a group is ``table[pos // block_size] * block_size + pos % block_size``):

    - ``full`` True: the runner sees the sequence for the first time (new, forked, or admitted
      again after preemption). ``block_ids[g]`` is group g's whole table after this step's
      allocation, and replaces any state the runner kept under this ``seq_id``.
    - ``full`` False: ``block_ids[g]`` are the ids appended since the runner last saw it, and
      ``replaced_blocks[g]`` the ``(index, block_id)`` entries replaced in place since then
      (copy-on-write when an ``n > 1`` sample writes into a shared block, and -1 where a
      sliding group released a block behind its window). ``()`` means none in any group.

    A runner asked to extend a sequence it never saw in full raises RuntimeError naming it
    (`block_tables.stale_delta`).
    ``is_last_prefill_chunk`` is True when the step computes through the sequence's last known
    token, so the runner samples one token for it: the last chunk of a prompt, and every decode
    (a decode is a one-token chunk that finishes what is known). When False (an earlier prompt
    chunk) the runner samples nothing for the sequence.
    ``sampling_params`` are the sample's own: for ``n > 1`` each sample carries a seed derived from
    the request's seed and ``sample_index``; they also ask for logprobs. ``output_position`` is
    the index within the completion of the token the step samples for the sequence (0 for a
    prompt's first token), which a seeded sample draws from. ``num_draft_tokens`` (speculative
    decoding, `EngineConfig.num_speculative_tokens`): a decode also verifies that many draft
    tokens after ``token_ids``, which the runner proposed itself; their slots are allocated, and
    the runner may return up to ``1 + num_draft_tokens`` tokens for the sequence.
    """

    seq_id: int
    request_id: RequestId
    sample_index: int
    token_ids: Tuple[int, ...]
    num_computed_tokens: int
    block_ids: Tuple[Tuple[int, ...], ...]
    is_last_prefill_chunk: bool
    sampling_params: SamplingParams
    full: bool = True
    replaced_blocks: Tuple[Tuple[Tuple[int, int], ...], ...] = ()
    output_position: int = 0
    num_draft_tokens: int = 0

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens with KV after the step (cached before plus computed now)."""
        return self.num_computed_tokens + len(self.token_ids)


@dataclass(frozen=True)
class ScheduledBatch:
    """What the runner computes in one step.

    ``block_copies``: copy-on-write ``(src, dst)`` block pairs to copy (K and V, every layer)
    before the forward. A block belongs to one KV-cache group at a time, so copying it in every
    shared K/V tensor copies exactly that group's layers. ``finished_seq_ids``: sequences finished since the previous batch; the
    runner may drop any per-sequence state it keeps for them. A batch can have no sequences and
    still carry ``finished_seq_ids``.
    ``num_prefill_tokens`` counts tokens of sequences computing their prompt (a recomputed
    prompt after preemption included); ``num_decode_tokens`` counts one token per decoding
    sequence.
    """

    sequences: Tuple[ScheduledSequence, ...] = ()
    block_copies: Tuple[Tuple[int, int], ...] = ()
    finished_seq_ids: Tuple[int, ...] = ()
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_seqs(self) -> int:
        return len(self.sequences)

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass(frozen=True)
class StepOutput:
    """What the runner returns for one batch.

    ``sampled_token_ids[i]`` is the token sampled for ``batch.sequences[i]``, or None when that
    entry is not the last chunk of its prompt (``is_last_prefill_chunk`` False). For an entry
    that verified draft tokens (``num_draft_tokens``) it may be a tuple of the accepted drafts
    and the token sampled after them: 1 to ``1 + num_draft_tokens`` tokens.
    ``seconds`` is the step's duration and ``breakdown`` its decomposition (op family ->
    seconds). ``logprobs``, when given, is aligned with the sequences too: each entry is None (no
    token, or logprobs not requested) or ``(sampled_logprob, ((token_id, logprob), ...))`` with
    the top ``sampling_params.logprobs`` alternatives, best first. ``logits``, when given, is
    aligned the same way: the float32 ``[vocab]`` logits of each entry whose
    ``sampling_params.prompt_logits`` (sampled nothing), None elsewhere.
    """

    sampled_token_ids: Tuple[object, ...]
    seconds: float = 0.0
    breakdown: Dict[str, float] = field(default_factory=dict)
    logprobs: Optional[Tuple[object, ...]] = None
    logits: Optional[Tuple[object, ...]] = None
