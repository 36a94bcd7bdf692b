"""The scheduler: which tokens of which sequences the next step computes.

Policy
------
- **Continuous batching.** Every step rebuilds the batch from the running sequences and the
  waiting queue. A step computes at most ``max_num_batched_tokens`` tokens and at most
  ``max_num_seqs`` sequences run at once. ``max_num_batched_tokens >= max_num_seqs`` is required,
  so every running decode always fits the token budget.
- **Order within a step.** (1) every running decode (one token each; ``1 + k`` under
  speculative decoding, below), oldest first; (2) the running sequences still computing a
  prompt ("continuing prefill chunks"), oldest first, each taking ``min(remaining prompt,
  remaining budget)``; (3) new admissions from the waiting queue in FCFS order while budget and
  sequence slots remain. Admission stops at the first request that
  does not fit (no skipping ahead of the head of the queue).
- **Chunked prefill, mixed with decode.** A prompt larger than the remaining budget is computed
  in chunks over several steps, in the same batches as the decodes.
- **Prefill first** (``batching="prefill_first"``, SGLang's default: its scheduler's
  ``get_next_batch_to_run`` runs a new prefill batch whenever one forms, and mixes the running
  decodes into it only under ``--enable-mixed-chunk``). A step with prompt work to do
  (continuing chunks, or the head of the queue admitted) runs it alone, on the whole token
  budget, and the decodes wait for the next step without prompt work. The default,
  ``"mixed"``, is the policy above (vLLM's, TensorRT-LLM's in-flight batching).
- **Prefix caching** through the allocator: ``lookup`` at admission sizes the first chunk (cached
  tokens are skipped), ``allocate`` claims the cached blocks and the slots before the forward, and
  ``update`` commits after it (full blocks then enter the cache).
- **Preemption by recompute.** When the allocator cannot give a running sequence its slots, the
  newest running sequence (the last admitted) is freed and put at the FRONT of the waiting queue,
  its generated tokens kept as part of the prompt it will recompute; then the allocation is
  retried. Several preemptions in one step keep their age order at the front. A step that
  preempted admits nothing (the memory is short; this also keeps a victim from being re-admitted
  in the step that evicted it), unless nothing else is left to run. Admissions never preempt:
  a request that does not fit waits. The oldest running sequence can always make
  progress, because every admitted request fits the cache alone (checked at ``add``).
- **Capacity policy.** ``capacity_policy="max_utilization"`` (the default, vLLM's way) admits
  a request when its first chunk's blocks are free now, and preempts when the running
  sequences outgrow the cache. ``"guaranteed_no_evict"`` (TensorRT-LLM's default
  ``CapacitySchedulerPolicy``) admits a request only when the blocks it needs to its end fit
  beside the reservations of the sequences admitted before it; a reservation ends when its
  sequence finishes. A request needs, times its samples, one block per ``block_size`` of
  its prompt plus ``max_tokens`` in a full group, and in a sliding group those its window
  spans (``KVCacheManager.max_blocks(tokens, 0)``), as TensorRT-LLM counts them
  (``KVCacheManager::getRemainingBlocksToCompletion`` per window size, which leaves the
  prefill chunk out). Running sequences then do not outgrow the cache, and a request that
  would not fit to its end waits instead; only a sliding group's prefill chunk, which that
  count leaves out, can still make one preempt.
- **Batch waiting** (TensorRT-LLM's ``batch_wait_timeout_iters`` and
  ``batch_wait_max_tokens_ratio``, both off by default: ``PyExecutor._waiting_requests``). When
  a step would run both decodes and prompt work, and fewer than ``batch_wait_timeout_iters``
  such steps have waited since prompt work last ran, the prompt work waits (the decodes run
  alone) unless the step's tokens reach ``batch_wait_max_tokens_ratio * max_num_batched_tokens``.
  The tokens are counted as TensorRT-LLM counts them: one per decode, and each prompt that
  would be scheduled (continuing chunks, then admissions in FCFS order within the token budget
  and the free sequence slots) counted whole.
- **Held prompts.** While ``hold_prompts`` is set (an attention data-parallel engine's balance,
  `gnomon.predict.data_parallel`, sets it step by step from `pending_work`), a step runs its
  decodes alone, as batch waiting's held steps do.
- **Arrivals.** ``add(request_id, prompt_token_ids, params, arrival_time)``; ``schedule(now)``
  moves the requests with ``arrival_time <= now`` to the back of the waiting queue, in
  (arrival_time, add order). ``next_arrival_time()`` tells a virtual clock where to jump when a
  batch comes back empty.
- **Stop conditions**, checked on each sampled token in this order: an EOS id (unless
  ``ignore_eos``) or a stop token id -> finish reason ``"stop"``; ``max_tokens`` generated ->
  ``"length"``. The stop token is kept in the output. ``abort(request_id)`` -> ``"abort"``.
- **Speculative decoding** (``num_speculative_tokens`` k > 0, as vLLM's scheduler and
  TensorRT-LLM's MTP run it): a decode computes its last token and verifies the k draft tokens
  the runner proposed after it, so it takes ``1 + k`` tokens of the budget and slots for them
  (``max_num_batched_tokens >= max_num_seqs x (1 + k)``, `EngineConfig`); the runner returns
  the accepted drafts and the token after them (1 to ``1 + k``), which are appended and
  checked against the stop conditions one by one (a stop drops the rest), and the KV of the
  token and the accepted drafts is committed, the rejected drafts' slots reused by the next
  step. A request reserves slots for its drafts past its last token (``add``'s block counts),
  and takes ``n = 1``.
- **Parallel sampling (n > 1)** through the allocator's ``fork``: the prompt is computed once by
  sample 0 up to its last token; then the other samples are forked (sharing every block), and
  each sample computes the prompt's last token itself (a one-token last chunk, copy-on-write on
  the shared last block) and samples its own first token with its own seed
  (`sequence.sample_seed`). From then on each sample decodes and stops on its own. A request
  reserves ``n`` sequence slots from admission, so forking never exceeds ``max_num_seqs``; a
  preempted sample comes back as an ordinary single sequence.
- **Requests that can never run are refused at ``add``** with a ValueError naming the request:
  a prompt token id outside ``vocab_size`` (when given; the first one, by position),
  the most blocks it holds at once exceed ``num_blocks`` (``KVCacheManager.max_blocks``: a
  full group's table, ``ceil((prompt + max_tokens) / block_size)``, plus for a sliding group
  at most its window and one step's tokens, so a lone long sequence never livelocks; under
  ``guaranteed_no_evict``, that times its samples),
  ``prompt + max_tokens > max_model_len``, or ``n > max_num_seqs``. Nothing else changes, so
  the scheduler never loops on one.
- ``finished_seq_ids`` in a batch lists sequences finished (or aborted) since the previous batch;
  a preempted sequence keeps its id and is not listed.

The step loop is ``batch = schedule(now)``; ``output = runner.execute(batch)``;
``update(batch, output)``. A batch with no sequences needs no ``update`` (but may carry
``finished_seq_ids``). Per step the work is per scheduled sequence and never grows with its
context or output so far: the running sequences' slots and their block-table deltas come from
one allocator ``step`` call (more only after a preemption; the whole table only when the runner
sees a sequence first), an admission is one ``admit`` (lookup and allocation in one pass over
its prompt, plus one ``take_block_updates`` for the step's admissions), the step's commits and
the finished sequences' frees are one more ``step`` call in ``update``, and ``update`` returns
one `SampleDelta` per sampled token.

A runner that knows its sampled tokens beforehand (the simulator's filler token) may run the
steps in which every running sequence decodes and nothing else happens without a batch:
``plain_decode_steps(token)`` bounds how many there can be, and each is ``begin_decode(now)``
(None when an arrival is due or the free blocks are short: ``schedule`` decides that step),
the runner's step, and ``end_decode(token, now)``. They make the same allocator calls in the
same order as ``schedule`` and ``update`` would, so the run is the same to the bit; what they
skip is building a `ScheduledSequence` and a `SampleDelta` per sequence per step.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

import numpy as np

from .batch import RequestId, ScheduledBatch, ScheduledSequence, StepOutput
from .engine_config import GUARANTEED_NO_EVICT, PREFILL_FIRST, EngineConfig
from .kv_cache import KVCacheManager
from .sampling_params import SamplingParams
from .sequence import (FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Request, SampleDelta,
                       Sequence, SequenceStatus)


PLAIN_DECODE = "plain decode step"  # the outstanding step between begin_decode and end_decode


def _check_int(name: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


class Scheduler:
    """Continuous-batching scheduler over a `KVCacheManager` (policy in the module docstring).
    Compiled, its attributes are declared in scheduler.pxd (where a new one goes too), and the
    step's loops run on C integers; the same code runs interpreted."""

    def __init__(self, kv_cache: KVCacheManager, config: EngineConfig = EngineConfig(), *,
                 eos_token_ids: Iterable[int] = (), vocab_size: Optional[int] = None) -> None:
        """`config`: the engine's settings (its scheduler fields; ``max_model_len`` given)."""
        if not isinstance(kv_cache, KVCacheManager):
            raise TypeError(f"kv_cache: expected a KVCacheManager, got {type(kv_cache).__name__}")
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config: expected an EngineConfig, got {type(config).__name__}")
        if config.max_model_len is None:
            raise ValueError("config.max_model_len: the scheduler needs it (the engine puts the "
                             "model's maximum position there)")
        self.kv = kv_cache
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        eos = tuple(eos_token_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in eos):
            raise ValueError(f"eos_token_ids: expected non-negative integers, got {eos!r}")
        self.eos_token_ids = frozenset(eos)
        self.capacity_policy = config.capacity_policy
        self.prefill_first = config.batching == PREFILL_FIRST
        self.vocab_size = None if vocab_size is None else _check_int("vocab_size", vocab_size, 1)
        self.batch_wait_timeout_iters = config.batch_wait_timeout_iters
        self.batch_wait_max_tokens_ratio = float(config.batch_wait_max_tokens_ratio)
        self.num_speculative_tokens = config.num_speculative_tokens
        self.hold_prompts = False  # set for one step by a data-parallel engine's balance
        self._batch_wait_iters = 0  # steps whose prompt work has waited since it last ran
        self._reservations: Dict[int, int] = {}  # seq_id -> blocks reserved (guaranteed_no_evict)
        self._reserved = 0
        self._requests: Dict[RequestId, Request] = {}
        self._live: Dict[int, Sequence] = {}                   # seq_id -> unfinished sequence
        self._arrivals: List[Tuple[float, int, Request]] = []   # heap of (arrival, order, req)
        self._waiting: Deque[Sequence] = deque()
        self._running: List[Sequence] = []                      # admission order, oldest first
        self._finished_since_batch: List[int] = []
        self._outstanding: Optional[ScheduledBatch] = None  # or PLAIN_DECODE
        self._outstanding_now = 0.0
        self._next_seq_id = 0
        self._order = 0
        self.num_preemptions = 0

    # ------------------------------------------------------------------ requests
    def add(self, request_id: RequestId, prompt_token_ids: Iterable[int], params: SamplingParams,
            arrival_time: float = 0.0) -> Request:
        """Queue a request, or refuse it (ValueError naming it) if it can never run."""
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            raise TypeError(f"request_id: expected a str or int, got {type(request_id).__name__}")
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: expected a SamplingParams, got {type(params).__name__}")
        if isinstance(arrival_time, bool) or not isinstance(arrival_time, (int, float)) \
                or not math.isfinite(arrival_time):
            raise ValueError(f"arrival_time: expected a finite number, got {arrival_time!r}")
        ids = np.asarray(prompt_token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"request {request_id!r}: prompt_token_ids: expected a non-empty "
                             f"1-D sequence of token ids, got shape {ids.shape}")
        top = ids.max() if ids.dtype.kind in "iu" else None
        if top is None or ids.min() < 0 or top >= 2**31:
            raise ValueError(f"request {request_id!r}: prompt_token_ids: expected integers in "
                             f"[0, 2**31), got dtype {ids.dtype}")
        if self.vocab_size is not None and top >= self.vocab_size:
            at = int(np.argmax(ids >= self.vocab_size))
            raise ValueError(f"request {request_id!r}: prompt_token_ids: token id {ids[at]} at "
                             f"position {at} is outside the model's vocabulary (ids below "
                             f"vocab_size={self.vocab_size})")
        prompt = tuple(ids.tolist())
        total = len(prompt) + params.max_tokens
        # a decode's draft tokens take slots past the last token
        blocks = self.kv.max_blocks(total + self.num_speculative_tokens,
                                    self.max_num_batched_tokens)
        if total > self.max_model_len:
            raise ValueError(f"request {request_id!r} can never run: prompt ({len(prompt)}) + "
                             f"max_tokens ({params.max_tokens}) = {total} tokens exceeds "
                             f"max_model_len={self.max_model_len}")
        if blocks > self.kv.num_blocks:
            raise ValueError(f"request {request_id!r} can never run: prompt ({len(prompt)}) + "
                             f"max_tokens ({params.max_tokens}) = {total} tokens need {blocks} "
                             f"blocks of {self.kv.block_size} at once (over the KV-cache "
                             f"groups), the KV cache has {self.kv.num_blocks}")
        if self.capacity_policy == GUARANTEED_NO_EVICT:
            reserved = self.kv.max_blocks(total + self.num_speculative_tokens, 0)
            if params.n * reserved > self.kv.num_blocks:
                raise ValueError(f"request {request_id!r} can never run: its {params.n} samples "
                                 f"reserve {params.n} x {reserved} blocks "
                                 f"({GUARANTEED_NO_EVICT}), the KV cache has "
                                 f"{self.kv.num_blocks}")
        if params.n > 1 and self.num_speculative_tokens:
            raise ValueError(f"request {request_id!r}: n={params.n} with speculative decoding "
                             f"(num_speculative_tokens {self.num_speculative_tokens}); it takes "
                             f"n=1")
        if params.n > self.max_num_seqs:
            raise ValueError(f"request {request_id!r} can never run: n={params.n} samples "
                             f"exceed max_num_seqs={self.max_num_seqs}")
        req = Request(request_id, prompt, params, float(arrival_time), self._order)
        self._order += 1
        seq = Sequence(self._new_seq_id(), req, 0, list(prompt))
        if params.n > 1:
            seq.prefill_target = len(prompt) - 1
        req.sequences.append(seq)
        self._requests[request_id] = req
        self._live[seq.seq_id] = seq
        heapq.heappush(self._arrivals, (req.arrival_time, req.order, req))
        return req

    def abort(self, request_id: RequestId) -> None:
        """Finish every sample of a request with reason "abort" and free its blocks."""
        if self._outstanding is not None:
            raise RuntimeError("abort: a batch is outstanding; call update() first")
        req = self._requests.get(request_id)
        if req is None:
            raise KeyError(f"request_id: unknown request {request_id!r}")
        if req.finished:
            return
        self._arrivals = [a for a in self._arrivals if a[2] is not req]
        heapq.heapify(self._arrivals)
        for seq in req.sequences:
            if seq.status is SequenceStatus.RUNNING:
                self._running.remove(seq)
            elif seq.status is SequenceStatus.WAITING and seq in self._waiting:
                self._waiting.remove(seq)
            if not seq.is_finished:
                self._finish(seq, FINISH_ABORT)
        # samples never forked: finished as aborted without ever existing in the allocator
        while len(req.sequences) < req.params.n:
            child = Sequence(self._new_seq_id(), req, len(req.sequences),
                             list(req.prompt_token_ids))
            child.status = SequenceStatus.FINISHED
            child.finish_reason = FINISH_ABORT
            req.sequences.append(child)

    def get_request(self, request_id: RequestId) -> Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise KeyError(f"request_id: unknown request {request_id!r}") from None

    def has_unfinished(self) -> bool:
        return bool(self._arrivals or self._waiting or self._running)

    def next_arrival_time(self) -> Optional[float]:
        """The earliest arrival not yet admitted to the waiting queue (for a virtual clock)."""
        return self._arrivals[0][0] if self._arrivals else None

    @property
    def num_running(self) -> int:
        return len(self._running)

    # ------------------------------------------------------------------ schedule
    def schedule(self, now: float = math.inf) -> ScheduledBatch:
        """Build the next step's batch (see the module docstring for the policy)."""
        if self._outstanding is not None:
            raise RuntimeError("schedule: the previous batch has not been passed to update()")
        while self._arrivals and self._arrivals[0][0] <= now:
            req = heapq.heappop(self._arrivals)[2]
            self._waiting.append(req.sequences[0])

        budget = self.max_num_batched_tokens
        preemptions_before = self.num_preemptions
        # (1) decodes, (2) continuing prefill chunks: one allocate_batch for all of them
        decodes: List[List] = []  # [seq, num_tokens, is_decode]
        prefilling = []
        per_decode = 1 + self.num_speculative_tokens  # its last token and the drafts
        for seq in self._running:
            if seq.is_decoding:
                decodes.append([seq, per_decode, True])
            else:
                prefilling.append(seq)
        waits = self.hold_prompts  # a data-parallel engine's balance holds them this step
        if waits:
            prefilling = []
        # a timeout of 0 never waits, whatever the ratio (TensorRT-LLM's rule)
        elif decodes and self.batch_wait_timeout_iters and (prefilling or self._waiting):
            waits = self._prompts_wait(len(decodes), prefilling)
            if waits:
                prefilling = []
        # prefill first: prompt work to do runs alone; the decodes run if none gets in
        alone = self.prefill_first and not waits and bool(prefilling or self._waiting)
        plan: List[List] = [] if alone else decodes
        budget -= len(plan) * per_decode
        for seq in prefilling:
            if budget == 0:
                break
            k = min(seq.prefill_target - seq.num_computed_tokens, budget)
            plan.append([seq, k, False])
            budget -= k
        reports: Dict[int, tuple] = {}  # seq_id -> its block-table report, as allocated
        budget += self._allocate_plan(plan, reports)

        # (3) admissions, FCFS
        admitted: List[List] = []
        slots = self._free_slots() if self._waiting else 0
        preempted = self.num_preemptions != preemptions_before and bool(plan)
        reserve = self.capacity_policy == GUARANTEED_NO_EVICT
        while self._waiting and budget > 0 and not preempted and not waits:
            seq = self._waiting[0]
            if seq.width > slots:
                break
            need = 0
            if reserve:
                req = seq.request
                need = seq.width * self.kv.max_blocks(
                    len(req.prompt_token_ids) + req.params.max_tokens, 0)
                if self._reserved + need > self.kv.num_blocks:
                    break
            cached = self.kv.admit(seq.seq_id, seq.token_ids, seq.prefill_target, budget)
            if cached < 0:
                break
            k = min(seq.prefill_target - cached, budget)
            if reserve:
                self._reservations[seq.seq_id] = need
                self._reserved += need
            self._waiting.popleft()
            seq.num_known = len(seq.token_ids)
            seq.num_computed_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self._running.append(seq)
            slots -= seq.width
            if k > 0:
                admitted.append([seq, k, False])
                budget -= k
            else:
                # an n > 1 parent whose prompt up to its last token is all cached: fork now and
                # give the samples their last prompt token, budget and cache permitting
                samples = self._fork(seq)
                take = samples[:budget]
                ok = self.kv.allocate_running([s.seq_id for s in take], [], [0] * len(take),
                                              [1] * len(take))
                for s in take[:ok]:
                    admitted.append([s, 1, False])
                budget -= ok

        if alone and not plan and not admitted:  # no prompt work got in: the decodes run
            plan = [d for d in decodes if d[0].status is SequenceStatus.RUNNING]
            self._allocate_plan(plan, reports)
        scheduled = plan + admitted
        if admitted:
            late = [seq.seq_id for seq, _, _ in admitted]
            reports.update(zip(late, self.kv.take_block_updates(late)))
        updates = [reports[seq.seq_id] for seq, _, _ in scheduled]
        seqs = []
        num_prefill = num_decode = 0
        for (seq, k, decoding), (full, block_ids, replaced) in zip(scheduled, updates):
            c = seq.num_computed_tokens
            drafts = 0
            if decoding:
                num_decode += k
                drafts = k - 1
                k = 1
            else:
                num_prefill += k
            req = seq.request
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            seqs.append(ScheduledSequence(
                seq.seq_id, req.request_id, seq.sample_index, tuple(seq.token_ids[c:c + k]), c,
                block_ids, c + k == len(seq.token_ids), seq.params, full, replaced,
                len(seq.token_ids) - seq.num_prompt_tokens, drafts))
        batch = ScheduledBatch(sequences=tuple(seqs), block_copies=self.kv.pending_copies(),
                               finished_seq_ids=tuple(self._finished_since_batch),
                               num_prefill_tokens=num_prefill, num_decode_tokens=num_decode)
        self._finished_since_batch = []
        if seqs:
            self._outstanding = batch
            self._outstanding_now = now
        return batch

    def _allocate_plan(self, plan: List[List], reports: dict) -> int:
        """Slots for every ``[seq, num_tokens, is_decode]`` entry of `plan`, preempting the
        newest running sequence while the allocator cannot give them (a victim in `plan` leaves
        it); the tokens the victims took from the budget."""
        start = 0
        freed = 0
        while start < len(plan):
            start += self._allocate(plan[start:], reports)
            if start == len(plan):
                break
            victim = self._running[-1]
            for i, (seq, k, _) in enumerate(plan):
                if seq is victim:
                    del plan[i]
                    freed += k
                    if i < start:
                        start -= 1
                    break
            reports.pop(victim.seq_id, None)
            self._preempt(victim)
        return freed

    def _prompts_wait(self, decodes: int, prefilling: list) -> bool:
        """Batch waiting's decision for a step of `decodes` decodes with prompt work pending
        (the module docstring), counting the waited steps."""
        budget = self.max_num_batched_tokens - decodes
        tokens = decodes
        for seq in prefilling:
            if budget <= 0:
                break
            tokens += len(seq.token_ids)
            budget -= seq.prefill_target - seq.num_computed_tokens
        slots = self._free_slots()
        for seq in self._waiting:
            if budget <= 0 or seq.width > slots:
                break
            tokens += len(seq.token_ids)
            budget -= seq.prefill_target
            slots -= seq.width
        if (self._batch_wait_iters >= self.batch_wait_timeout_iters
                or tokens >= self.batch_wait_max_tokens_ratio * self.max_num_batched_tokens):
            self._batch_wait_iters = 0
            return False
        self._batch_wait_iters += 1
        return True

    # ------------------------------------------------------------------ update
    def update(self, batch: ScheduledBatch, output: StepOutput,
               now: Optional[float] = None) -> List[SampleDelta]:
        """Commit the step's KV, append sampled tokens, apply stop conditions, fork n > 1.

        Returns what each sample gained, in batch order: one `SampleDelta` per sampled token,
        and one with no token for a request that ended with its prompt's logits.
        ``now`` stamps first-token, token and finish times; by default the step's schedule time
        plus ``output.seconds``.
        """
        if batch.is_empty:
            return []
        if batch is not self._outstanding:
            raise ValueError("batch: expected the batch returned by the last schedule()")
        if not isinstance(output, StepOutput):
            raise TypeError(f"output: expected a StepOutput, got {type(output).__name__}")
        sampled = output.sampled_token_ids
        if len(sampled) != len(batch.sequences):
            raise ValueError(f"output.sampled_token_ids: expected {len(batch.sequences)} entries "
                             f"(one per scheduled sequence), got {len(sampled)}")
        ids, context_lens = [], []
        drafted, accepted, counts = [], [], []  # the allocator learns the accepted drafts
        for s, t in zip(batch.sequences, sampled):
            samples = s.is_last_prefill_chunk and not s.sampling_params.prompt_logits
            if samples != (t is not None):
                raise ValueError(f"output.sampled_token_ids: sequence {s.seq_id} expected "
                                 f"{'a token' if samples else 'None'}, got {t!r}")
            ids.append(s.seq_id)
            n = len(s.token_ids)
            if isinstance(t, tuple):
                if not 1 <= len(t) <= 1 + s.num_draft_tokens:
                    raise ValueError(f"output.sampled_token_ids: sequence {s.seq_id} verified "
                                     f"{s.num_draft_tokens} draft tokens, so it takes 1 to "
                                     f"{1 + s.num_draft_tokens} tokens, got {t!r}")
                if len(t) > 1:  # the accepted drafts' KV is computed, the last token's not
                    drafted.append(s.seq_id)
                    accepted.extend(t[:-1])
                    counts.append(len(t) - 1)
                    n += len(t) - 1
            context_lens.append(s.num_computed_tokens + n)
        logprobs = output.logprobs
        if logprobs is not None and len(logprobs) != len(batch.sequences):
            raise ValueError(f"output.logprobs: expected {len(batch.sequences)} entries, "
                             f"got {len(logprobs)}")
        if now is None:
            now = self._outstanding_now + float(output.seconds)
        self._outstanding = None

        eos = self.eos_token_ids
        deltas: List[SampleDelta] = []
        live = self._live
        freed: List[int] = []
        forks: List[Sequence] = []
        if drafted:
            self.kv.allocate_running(drafted, accepted, counts, [0] * len(drafted))
        for i, (seq_id, context_len, token) in enumerate(zip(ids, context_lens, sampled)):
            seq = live[seq_id]  # the batch is the outstanding one: all its sequences are live
            seq.num_computed_tokens = context_len
            req = seq.request
            if token is None:
                if seq.is_unforked_parent and seq.num_computed_tokens == seq.prefill_target:
                    forks.append(seq)
                elif seq.params.prompt_logits and context_len == len(seq.token_ids):
                    # its prompt's logits instead of a token: it ends here
                    if output.logits is not None:
                        req.prompt_logits = output.logits[i]
                    self._running.remove(seq)
                    self._finish(seq, FINISH_LENGTH, free=False)
                    freed.append(seq_id)
                    req.finish_time = now
                    deltas.append(SampleDelta(req.request_id, seq.sample_index, (),
                                              FINISH_LENGTH, True))
                continue
            tokens = token if isinstance(token, tuple) else (token,)
            if len(tokens) > 1:
                seq.num_known = len(seq.token_ids) + len(tokens) - 1
            lp = None
            if logprobs is not None and logprobs[i] is not None:
                lp = logprobs[i]
                seq.output_logprobs.append(lp)
            if req.first_token_time is None:
                req.first_token_time = now
            params = seq.params
            reason = None
            kept = 0
            for token in tokens:  # a stop drops the tokens after it
                token = int(token)
                seq.token_ids.append(token)
                seq.token_times.append(now)
                kept += 1
                if (token in eos and not params.ignore_eos) or token in params.stop_token_ids:
                    reason = FINISH_STOP
                elif len(seq.token_ids) - seq.num_prompt_tokens >= params.max_tokens:
                    reason = FINISH_LENGTH
                if reason is not None:
                    break
            if reason is not None:
                self._running.remove(seq)
                self._finish(seq, reason, free=False)
                freed.append(seq_id)
                if req.finished:
                    req.finish_time = now
            new = (token,) if kept == 1 else tuple(seq.token_ids[len(seq.token_ids) - kept:])
            deltas.append(SampleDelta(req.request_id, seq.sample_index, new, reason,
                                      reason is not None and req.finished, lp))
        # the step's KV committed and the finished freed in one allocator call; a fork needs
        # its parent committed, and neither a fork nor a free touches the other's blocks
        self.kv.step(ids, context_lens, freed, [], [], [], [])
        for seq in forks:
            self._fork(seq)
        return deltas

    # ------------------------------------------------------------------ plain decode steps
    def plain_decode_steps(self, token: int) -> int:
        """How many of the next steps at most are plain decodes that `begin_decode` and
        `end_decode` may run in place of `schedule` and `update`: steps in which every running
        sequence computes its one new token and samples `token` (a runner that knows its
        tokens beforehand: the simulator's), and nothing else happens. 0 when the next step
        is not one: a batch outstanding, a request waiting, a finish the runner has not been
        told of, a prompt still being computed, an ``n > 1`` request, a sample that `token`
        would stop, or speculative decoding (its steps verify drafts). Otherwise one less than
        the fewest tokens a running sample has left, so that none finishes. Arrivals and KV are
        `begin_decode`'s to check, step by step."""
        if self._outstanding is not None or self._waiting or self._finished_since_batch \
                or not self._running or self.num_speculative_tokens:
            return 0
        steps = self.max_model_len
        eos = self.eos_token_ids
        for seq in self._running:
            params = seq.params
            if not seq.is_decoding or seq.request.params.n != 1 \
                    or (token in eos and not params.ignore_eos) or token in params.stop_token_ids:
                return 0
            left = params.max_tokens - (len(seq.token_ids) - seq.num_prompt_tokens) - 1
            if left < steps:
                steps = left
        return steps

    def begin_decode(self, now: float):
        """Allocates the slots of one of the `plain_decode_steps` as `schedule` would (the same
        allocator call, the same order) and returns its ``(new_tokens, context_len)`` pairs in
        batch order. None, with nothing changed, when the step is not plain after all: an
        arrival is due by `now`, or the free blocks might not give every running sequence a
        new block in every KV-cache group (`schedule` then decides, preempting if it must)."""
        if not self.decode_ready(now):
            return None
        n = len(self._running)
        if self._allocate([[seq, 1, True] for seq in self._running]) != n:
            raise RuntimeError("begin_decode: the allocator refused a slot it had free blocks for")
        self._outstanding = PLAIN_DECODE  # schedule() and update() refuse until end_decode
        return tuple([(1, seq.num_computed_tokens) for seq in self._running])

    def pending_work(self, now: float) -> Tuple[bool, int]:
        """What `schedule` at `now` would find, before any allocation: whether any prompt work
        waits or continues (a request due by `now` counts), and how many sequences decode."""
        decoding = 0
        for seq in self._running:
            if seq.is_decoding:
                decoding += 1
        prompts = decoding < len(self._running) or bool(self._waiting) or bool(
            self._arrivals and self._arrivals[0][0] <= now)
        return prompts, decoding

    def decode_ready(self, now: float) -> bool:
        """Whether `begin_decode` at `now` would begin its step: no arrival due by `now`, and
        free blocks for a new one per running sequence in every KV-cache group."""
        return not (self._arrivals and self._arrivals[0][0] <= now) and \
            self.kv.num_free_blocks >= len(self._running) * len(self.kv.windows)

    def end_decode(self, token: int, now: float) -> None:
        """Ends the step `begin_decode` began, as `update` would: commits every running
        sequence's new token and appends `token`, sampled at `now`, to each."""
        if self._outstanding is not PLAIN_DECODE:
            raise RuntimeError("end_decode: no plain decode step is outstanding (begin_decode "
                               "returned None, or was not called)")
        self._outstanding = None
        ids, context_lens = [], []
        for seq in self._running:
            ids.append(seq.seq_id)
            context_lens.append(seq.num_computed_tokens + 1)
        self.kv.commit_running(ids, context_lens)
        for seq in self._running:
            seq.num_computed_tokens += 1
            seq.token_ids.append(token)
            seq.token_times.append(now)

    # ------------------------------------------------------------------ internals
    def _allocate(self, plan: List[List], reports: Optional[dict] = None) -> int:
        """Slots for ``[seq, num_tokens, is_decode]`` entries in one allocator call: how many
        leading entries got theirs (each all or nothing). With `reports`, the call is
        `KVCacheManager.step`, whose block-table reports of those entries join it by id."""
        ids, new_ids, counts, nums = [], [], [], []
        for seq, k, _ in plan:
            ids.append(seq.seq_id)
            fresh = seq.token_ids[seq.num_known:]
            new_ids.extend(fresh)
            counts.append(len(fresh))
            nums.append(k)
        if reports is None:
            ok = self.kv.allocate_running(ids, new_ids, counts, nums)
        else:
            ok, updates = self.kv.step([], None, [], ids, new_ids, counts, nums)
            reports.update(zip(ids, updates))
        for seq, _, _ in plan[:ok]:
            seq.num_known = len(seq.token_ids)
        return ok

    def _free_slots(self) -> int:
        """Sequence slots left under ``max_num_seqs`` (an unforked n > 1 parent holds n)."""
        used = 0
        for seq in self._running:
            used += seq.width
        return self.max_num_seqs - used

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def _fork(self, parent: Sequence) -> List[Sequence]:
        """Fork the samples 1..n-1 of ``parent``'s request; all n now end at the prompt's end."""
        req = parent.request
        parent.prefill_target = len(parent.token_ids)
        children = []
        for i in range(1, req.params.n):
            child = Sequence(self._new_seq_id(), req, i, list(parent.token_ids))
            self.kv.fork(parent.seq_id, child.seq_id)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_known = parent.num_known
            child.status = SequenceStatus.RUNNING
            req.sequences.append(child)
            self._live[child.seq_id] = child
            children.append(child)
        share = self._reservations.get(parent.seq_id, 0) // req.params.n
        if share:  # the parent reserved for all n samples: each now holds its own part
            for seq in [parent] + children:
                self._reservations[seq.seq_id] = share
        pos = self._running.index(parent) + 1
        self._running[pos:pos] = children
        return [parent] + children

    def _release(self, seq: Sequence) -> None:
        self._reserved -= self._reservations.pop(seq.seq_id, 0)

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq)
        self._release(seq)
        self.kv.free(seq.seq_id)
        seq.reset_for_recompute()
        self._waiting.appendleft(seq)
        self.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: str, free: bool = True) -> None:
        """Finishes `seq`; its blocks are freed here unless the caller frees them (`free`)."""
        self._live.pop(seq.seq_id, None)
        self._release(seq)
        if free and seq.seq_id in self.kv:
            self.kv.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._finished_since_batch.append(seq.seq_id)
