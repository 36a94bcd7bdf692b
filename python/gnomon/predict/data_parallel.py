"""Attention data parallelism in the simulator: ``dp`` engines in lockstep on one clock.

Under SGLang's ``--enable-dp-attention``, TensorRT-LLM's ``enable_attention_dp`` and vLLM's
data-parallel attention, each of ``dp`` groups of ``tp`` GPUs serves its own requests through
attention, with its own scheduler and KV pool, and the MoE layers are shared by all the groups
over expert parallelism. `DataParallelEngine` is that: one `LLMEngine` per group (the real
scheduler and KV manager, each group's blocks what its GPUs hold), on one `VirtualClock`.

A step schedules every group's batch at the same instant. `DataParallelRunner` prices each busy
group's batch with the tokens of all groups in the routed experts (`StepShape.dp_tokens`) and
advances the clock by the slowest group's step: the groups meet at every MoE layer, so a step
ends when the busiest group's does (TensorRT-LLM's attention-DP write-up states the same: "the
iteration time is dominated by the slowest rank"). A group with nothing to run still joins the
MoE layers with a dummy batch, as the engines do; its step is never the slowest, so it is not
priced. Every group's scheduler then takes its tokens at the step's end. A group whose step is
a plain decode takes it without a batch (`Scheduler.begin_decode`), and batch waiting is off in
the groups, as TensorRT-LLM's executor skips it under attention DP. Under speculative decoding
each group has its own `gnomon.predict.simulated.Drafter`, whose passes add to that group's
step; the routed experts of its one-token passes see every group's sampling sequences.

Balance (TensorRT-LLM's ``attention_dp_config``: ``enable_balance``, ``timeout_iters``,
``batching_wait_iters``; `AttentionDpBalance`): every group's prompt work waits until every group
has some, so that no step pairs one group's prefill with the others' decodes. While some group has
none (and every group decodes), all hold their prompts, up to ``timeout_iters`` steps; once all
have prompt work and all decode, they hold it ``batching_wait_iters`` steps more to gather more.
Off by default, as in TensorRT-LLM; InferenceMAX's launches turn it on (`gnomon.predict.measured`'s
launch rules).

Load balancing: a request goes to the group with the fewest unfinished requests, ties to the one
with the fewest prompt tokens among them, then the lowest index. This is TensorRT-LLM's
attention-DP balancing, the engine of the measured DP rows (its request queue caps each rank's
active requests at the balanced share and fills the ranks with the fewest active tokens
first). In a closed loop of equal requests it splits the concurrency evenly, as SGLang's
round-robin and vLLM's least-loaded balancer also do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from gnomon.engine.batch import ScheduledBatch, StepOutput
from gnomon.engine.llm import LLMEngine, RequestOutput
from gnomon.engine.parallel import check_dp, check_ep, check_tp
from gnomon.engine.sequence import Request, SampleDelta

from .shapes import ModelSpec, StepShape
from .simulated import Drafter, StepRecord, VirtualClock, filler_token, sampled, track


@dataclass(frozen=True)
class AttentionDpBalance:
    """TensorRT-LLM's attention-DP balance (module docstring; its defaults, off), from an
    `EngineConfig`'s ``attention_dp_*`` fields, which checks them."""

    enabled: bool = False
    timeout_iters: int = 50
    batching_wait_iters: int = 10


class DataParallelRunner:
    """Prices one lockstep step of the `dp` groups (module docstring); ``steps`` records each
    non-empty step as one `StepRecord` of all groups' tokens and sequences, its seconds and
    breakdown the slowest group's."""

    keep_batches = False

    def __init__(self, model: ModelSpec, predictor, clock: VirtualClock, *, tp: int, ep: int,
                 dp: int, num_speculative_tokens: int = 0,
                 draft_acceptance_rate: float = 0.0) -> None:
        """With ``num_speculative_tokens`` k > 0, a `Drafter` per group (k drafts accepted
        with ``draft_acceptance_rate``), whose passes add to that group's step."""
        self.model, self.predictor, self.clock = model, predictor, clock
        self.tp = check_tp(model.config, tp, "tp")
        self.dp = check_dp(model.config, dp)
        self.ep = check_ep(model.config, self.tp, ep, dp=self.dp)
        self.token = filler_token(model)
        self.known = [set() for _ in range(self.dp)]
        self.steps: List[StepRecord] = []
        self.drafters = ([Drafter(model, num_speculative_tokens, draft_acceptance_rate)
                          for _ in range(self.dp)] if num_speculative_tokens else None)

    def execute(self, work: Sequence[Union[ScheduledBatch, Tuple]]) -> List[StepOutput]:
        """Every group's output of the step, the clock advanced by the slowest group's time. A
        group's work is its `ScheduledBatch`, or the ``(1, context_len)`` pairs of a plain
        decode step (`Scheduler.begin_decode`), whose sequences all sample."""
        shapes = []
        for g, (known, w) in enumerate(zip(self.known, work)):
            if isinstance(w, ScheduledBatch):
                track(known, w)
                if not w.is_empty:
                    shapes.append((w.num_prefill_tokens, w.num_decode_tokens,
                                   len(w.sequences), w, g))
            elif w:
                shapes.append((0, len(w), len(w), w, g))
        if not shapes:
            return [StepOutput(())] * len(work)
        prefill = sum(s[0] for s in shapes)
        decode = sum(s[1] for s in shapes)
        X = prefill + decode
        drafters = self.drafters
        samples = sum(sum(q.is_last_prefill_chunk for q in w.sequences)
                      for *_, w, _ in shapes) if drafters else 0
        seconds, breakdown = -1.0, {}
        for _, _, n, w, g in shapes:
            shape = (StepShape.from_batch(w, self.model, self.tp, self.ep, self.dp, X)
                     if isinstance(w, ScheduledBatch) else
                     StepShape(self.model, w, n, 0, n, self.tp, self.ep, self.dp, X))
            cost = self.predictor.predict(shape)
            group = (cost.seconds, cost.breakdown)
            if drafters:  # a plain decode never drafts (`Scheduler.plain_decode_steps`)
                group = drafters[g].add_cost(self.predictor, w, shape, *group, samples)
            if group[0] > seconds:
                seconds, breakdown = group
        start = self.clock()
        self.clock.advance(seconds)
        self.steps.append(StepRecord(start, seconds, breakdown, prefill, decode,
                                     sum(s[2] for s in shapes)))
        out = []
        for g, w in enumerate(work):
            if not isinstance(w, ScheduledBatch) or w.is_empty:
                out.append(StepOutput(()))
                continue
            tokens = sampled(w, self.token)
            if drafters:
                tokens = drafters[g].accepted(w, tokens)
            out.append(StepOutput(tokens, seconds, breakdown))
        return out

    def idle(self) -> None:
        """Nothing to reset: predicted steps carry no wall time."""


class _Schedulers:
    """What a run reads of the groups' schedulers together."""

    def __init__(self, engine: "DataParallelEngine") -> None:
        self._engine = engine

    def get_request(self, request_id) -> Request:
        return self._engine.group(request_id).scheduler.get_request(request_id)

    @property
    def num_preemptions(self) -> int:
        return sum(g.scheduler.num_preemptions for g in self._engine.groups)


class _Pools:
    """What a run reads of the groups' KV pools together: blocks summed, usage over all."""

    def __init__(self, groups: Sequence[LLMEngine]) -> None:
        self._pools = [g.kv for g in groups]
        self.windows = self._pools[0].windows

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self._pools)

    @property
    def usage(self) -> float:
        return sum(p.usage * p.num_blocks for p in self._pools) / self.num_blocks

    @property
    def blocks_in_use(self):
        return tuple(map(sum, zip(*(p.blocks_in_use for p in self._pools))))

    def stats(self) -> dict:
        out: Dict[str, float] = {}
        for p in self._pools:
            for k, v in p.stats().items():
                out[k] = out.get(k, 0) + v
        return out


class DataParallelEngine:
    """`dp` group engines in lockstep (module docstring), with the surface `run_workload` uses
    of an `LLMEngine`: requests in, steps, outputs, and the groups' schedulers and KV pools
    read together (``scheduler``, ``kv``)."""

    def __init__(self, groups: Sequence[LLMEngine], runner: DataParallelRunner,
                 balance: AttentionDpBalance = AttentionDpBalance()) -> None:
        if len(groups) != runner.dp:
            raise ValueError(f"groups: expected one engine per data-parallel group "
                             f"({runner.dp}), got {len(groups)}")
        self.groups, self.runner, self.clock = list(groups), runner, runner.clock
        self.scheduler = _Schedulers(self)
        self._schedulers = [g.scheduler for g in self.groups]
        self.kv = _Pools(self.groups)
        self._group_of: Dict[object, int] = {}
        self._load = [[0, 0] for _ in self.groups]  # per group: unfinished requests, tokens
        self.balance = balance
        self._held = self._gathered = 0  # steps prompts were held waiting, and gathering

    @property
    def engine_config(self):
        """The groups' `EngineConfig` (each group's engine runs with the same one)."""
        return self.groups[0].engine_config

    def group(self, request_id) -> LLMEngine:
        try:
            return self.groups[self._group_of[request_id]]
        except KeyError:
            raise KeyError(f"request_id: unknown request {request_id!r}") from None

    def add_request(self, request_id, prompt, params=None,
                    arrival_time: Optional[float] = None) -> None:
        """Queue a request on the least-loaded group (module docstring)."""
        if request_id in self._group_of:
            raise ValueError(f"request_id: {request_id!r} was already added")
        g = min(range(len(self.groups)), key=lambda i: (*self._load[i], i))
        self.groups[g].add_request(request_id, prompt, params, arrival_time)
        self._group_of[request_id] = g
        self._load[g][0] += 1
        self._load[g][1] += len(prompt)

    def step(self) -> List[SampleDelta]:
        """One lockstep step of every group; their `SampleDelta`s, group by group. A group
        whose step is a plain decode (`Scheduler.plain_decode_steps`: every running sequence
        decodes and none finishes) takes it through `Scheduler.begin_decode` and `end_decode`,
        the same allocator calls and tokens as `schedule` and `update`, without a batch."""
        now, token = self.clock(), self.runner.token
        if self.balance.enabled:
            hold = self._hold_prompts(now)
            for s in self._schedulers:
                s.hold_prompts = hold
        work = [s.begin_decode(now) if s.plain_decode_steps(token) and s.decode_ready(now)
                else s.schedule(now) for s in self._schedulers]
        outputs = self.runner.execute(work)
        end = self.clock()
        deltas: List[SampleDelta] = []
        for s, w, output in zip(self._schedulers, work, outputs):
            if not isinstance(w, ScheduledBatch):
                s.end_decode(token, end)
                continue
            for delta in s.update(w, output, now=end):
                deltas.append(delta)
                if delta.finished:
                    load = self._load[self._group_of[delta.request_id]]
                    load[0] -= 1
                    load[1] -= len(s.get_request(delta.request_id).prompt_token_ids)
        return deltas

    def _hold_prompts(self, now: float) -> bool:
        """The balance's decision for this step (module docstring), as TensorRT-LLM's
        ``PyExecutor._balance_adp_requests`` makes it from every rank's counts."""
        work = [s.pending_work(now) for s in self._schedulers]
        decoding = all(d for _, d in work)
        slots = all(d < s.max_num_seqs for (_, d), s in zip(work, self._schedulers))
        if slots and all(p for p, _ in work):
            self._held = 0
            if decoding:
                if self._gathered < self.balance.batching_wait_iters:
                    self._gathered += 1
                    return True
                self._gathered = 0
            return False
        self._held += 1
        if self._held >= self.balance.timeout_iters or not decoding:
            self._held = 0
            return False
        return True

    def has_unfinished_requests(self) -> bool:
        return any(g.has_unfinished_requests() for g in self.groups)

    def next_arrival_time(self) -> Optional[float]:
        times = [t for t in (g.next_arrival_time() for g in self.groups) if t is not None]
        return min(times, default=None)

    def get_output(self, request_id) -> RequestOutput:
        return self.group(request_id).get_output(request_id)

    @property
    def num_kv_blocks(self) -> int:
        return self.kv.num_blocks
