"""The simulated runner, the virtual clock, and the real runner on that clock.

`SimulatedRunner` answers the engine's runner surface (``execute``, ``execute_logits``) without
weights, KV or any device: each step it turns the `ScheduledBatch` into a `StepShape`, asks its
predictor for the cost, advances the `VirtualClock` by it, and returns a fixed non-EOS token for
every sequence that samples. Workloads run with ``ignore_eos=True`` and ``max_tokens`` equal to
each request's output length, so requests end exactly where the workload says.

Speculative decoding (``num_speculative_tokens`` k, `gnomon.engine.scheduler`'s policy): the
drafter (`Drafter`) is one more decoder layer of the target's shape, its last, with the
target's embedding and lm_head, as DeepSeek-V3's multi-token-prediction module is (its
``eh_proj``, a ``2 x hidden`` to ``hidden`` projection, is left out: under 1% of the layer's
weights, a few percent of what a small decode reads of them). Each step it runs once over the
step's tokens, as the target does (its own KV for every position), then
``k - 1`` more times over one token per sequence that samples, TensorRT-LLM's MTP-Eagle way of
reusing one module for k drafts; a step costs the target's prediction plus those passes' (their
engine overhead left out: the one step carries it). Each draft is accepted with
``draft_acceptance_rate`` a when the drafts before it were, so a decode yields on average
``1 + a + ... + a^k`` tokens (the acceptance length). The tokens are drawn without randomness:
each sequence adds the acceptance length to a running credit every decode, starting from a
phase of its own (the golden-ratio sequence over its id, so sequences do not step together),
and takes the whole tokens of it, 1 to ``1 + k``.

`TimedRunner` wraps a real `ModelRunner` so a real run keeps time on the same kind of clock: the
clock advances by the wall time that really passed since the previous step's forward ended
(scheduling, input prep, forward, sampling, bookkeeping), while idle gaps between arrivals are
skipped rather than slept through. A real run and a simulation then differ only in where step
durations come from, which is what makes "same decisions" testable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Set

from gnomon.engine.batch import ScheduledBatch, StepOutput
from gnomon.engine.block_tables import stale_delta
from gnomon.engine.kv_cache import resolve_num_blocks
from gnomon.engine.parallel import check_ep, check_tp
from gnomon.hardware import Hardware

from .cost import PredictionRefused
from .engines import KV_MEMORY
from .shapes import ModelSpec, StepShape

GPU_MEMORY_UTILIZATION = 0.9  # the share of HBM the engine may use, as vLLM's default


class VirtualClock:
    """Seconds on a clock that only moves when told to (``advance``, ``jump_to``)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"seconds: a clock cannot go back or by NaN, got {seconds}")
        self.now += seconds

    def jump_to(self, t: float) -> None:
        self.now = max(self.now, float(t))


@dataclass(frozen=True)
class StepRecord:
    """One executed (non-empty) step: when it started on the clock, its seconds and breakdown,
    its token and sequence counts, and the batch itself only where it was asked for
    (`TimedRunner` always; `SimulatedRunner` with ``keep_batches``)."""

    start: float
    seconds: float
    breakdown: Dict[str, float]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_seqs: int
    batch: Optional[ScheduledBatch] = None

    @classmethod
    def of(cls, start: float, batch: ScheduledBatch, seconds: float,
           breakdown: Dict[str, float], keep_batch: bool = True) -> "StepRecord":
        return cls(start, seconds, breakdown, batch.num_prefill_tokens, batch.num_decode_tokens,
                   len(batch.sequences), batch if keep_batch else None)


def sampled(batch: ScheduledBatch, token: int):
    """The filler `token` for each sequence that samples this step (none for a request that
    asked for its prompt's logits, which a simulation does not compute)."""
    return tuple(token if s.is_last_prefill_chunk and not s.sampling_params.prompt_logits
                 else None for s in batch.sequences)


def track(known: Set[int], batch: ScheduledBatch) -> None:
    """Updates `known`, the sequences a runner has seen in full, by `batch`; a delta to a
    sequence it never saw in full fails as in the real runner."""
    known.difference_update(batch.finished_seq_ids)
    for s in batch.sequences:
        if s.full:
            known.add(s.seq_id)
        elif s.seq_id not in known:
            raise stale_delta(s)


def filler_token(model: ModelSpec) -> int:
    """The smallest token id that is not an EOS id."""
    eos = set(model.config.eos_token_ids)
    return next(t for t in range(len(eos) + 1) if t not in eos)


def activation_bytes(model: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int,
                     tp: int = 1) -> float:
    """An estimate of the peak activation memory of one step on one GPU: a full token budget's
    hidden states, QKV and MLP intermediates (twice, input and output live at once), and
    float32 logits for every sequence. vLLM measures this with a profiling forward; a
    simulation cannot, and says so in its report."""
    c = model.config
    inter = (c.top_k if c.is_moe else 1) * 2 * c.intermediate_size // tp
    per_token = 2 * c.hidden_size + c.q_size // tp + 2 * c.kv_size + inter
    logits = max_num_seqs * c.vocab_size // tp * 4
    return 2 * max_num_batched_tokens * per_token * model.dtype_bytes + logits


def kv_blocks_for_hardware(model: ModelSpec, hardware: Hardware, *, block_size: int = 16,
                           tp: int = 1, max_num_batched_tokens: int = 8192,
                           max_num_seqs: int = 256,
                           gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                           enable_hybrid_kv: bool = True, kv_memory: str = "total",
                           dp: int = 1) -> int:
    """KV blocks that fit on `hardware` (per GPU, times ``tp`` GPUs in lockstep), by the
    engine's budget arithmetic (`kv_memory`, as `gnomon.predict.engines.KV_MEMORY` states):
    ``gpu_memory_utilization`` of the HBM less the weights and the activations ("total",
    vLLM's), of what those leave free ("free", TensorRT-LLM's ``free_gpu_memory_fraction``),
    or of the HBM less the weights alone ("static", SGLang's ``mem_fraction_static``, whose
    rest holds the activations); a block holds one token slot of every layer of one KV-cache
    group (`gnomon.engine.kv_cache`); under attention data parallelism (`dp` groups of `tp`)
    the blocks of one group, its GPUs holding their share of the experts
    (`ModelSpec.weight_bytes`). Raises `PredictionRefused` with the bytes needed and the bytes
    available when the model does not fit."""
    c = model.config
    check_tp(c, tp, "tp")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization: expected a fraction in (0, 1], got "
                         f"{gpu_memory_utilization}")
    if kv_memory not in KV_MEMORY:
        raise ValueError(f"kv_memory: expected one of {', '.join(KV_MEMORY)}, got {kv_memory!r}")
    hbm = hardware.hbm_gb.value * 1e9
    weights = model.weight_bytes(tp, dp)
    acts = 0.0 if kv_memory == "static" else activation_bytes(
        model, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=tp)
    if kv_memory == "free":
        usable = weights + acts + max(hbm - weights - acts, 0.0) * gpu_memory_utilization
    else:
        usable = hbm * gpu_memory_utilization
    per_block = (c.kv_cache_groups(enable_hybrid_kv).layers_per_group * block_size
                 * c.kv_cache_width(tp) * model.kv_bytes)
    budget = usable - weights - acts
    if budget < per_block:
        raise PredictionRefused(
            f"{model.name} does not fit on {tp} x {hardware.name}: per GPU it needs "
            f"{weights / 1e9:.2f} GB of weights + {acts / 1e9:.2f} GB of activations + at "
            f"least one {per_block / 1e6:.2f} MB KV block, and "
            f"{usable / 1e9:.2f} GB is available ({gpu_memory_utilization:.0%} of "
            f"{hardware.hbm_gb.value:g} GB{' left free' if kv_memory == 'free' else ''}; "
            f"kv_memory {kv_memory!r})")
    return resolve_num_blocks(kv_cache_bytes=int(budget), bytes_per_block=per_block)


class SimulatedRunner:
    """A runner that predicts instead of computing (module docstring). ``steps`` records every
    non-empty step (`StepRecord`), with its batch when ``keep_batches``. Per sequence it keeps
    only that it has seen it (``known``): a shape needs each sequence's ``(new_tokens,
    context_len)``, which the batch carries, and no block table; a delta to a sequence it
    never saw in full fails as in the real runner."""

    def __init__(self, model: ModelSpec, predictor, clock: VirtualClock, *, tp: int = 1,
                 ep: int = 1, keep_batches: bool = False, num_speculative_tokens: int = 0,
                 draft_acceptance_rate: float = 0.0) -> None:
        """With ``num_speculative_tokens`` k > 0, a `Drafter` of k drafts accepted with
        ``draft_acceptance_rate``."""
        if not isinstance(model, ModelSpec):
            raise TypeError(f"model: expected a ModelSpec, got {type(model).__name__}")
        if not callable(getattr(predictor, "predict", None)):
            raise TypeError(f"predictor: expected a StepCostPredictor (with predict(shape)), got "
                            f"{type(predictor).__name__}")
        self.model, self.predictor, self.clock = model, predictor, clock
        self.tp = check_tp(model.config, tp, "tp")
        self.ep = check_ep(model.config, self.tp, ep)
        self.token = filler_token(model)
        self.keep_batches = bool(keep_batches)
        self.known: Set[int] = set()
        self.steps: List[StepRecord] = []
        self.drafter = (Drafter(model, num_speculative_tokens, draft_acceptance_rate)
                        if num_speculative_tokens else None)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        track(self.known, batch)
        if batch.is_empty:
            return StepOutput(())
        shape = StepShape.from_batch(batch, self.model, self.tp, self.ep)
        cost = self.predictor.predict(shape)
        seconds, breakdown = cost.seconds, cost.breakdown
        tokens = sampled(batch, self.token)
        if self.drafter is not None:
            seconds, breakdown = self.drafter.add_cost(self.predictor, batch, shape, seconds,
                                                       breakdown)
            tokens = self.drafter.accepted(batch, tokens)
        start = self.clock()
        self.clock.advance(seconds)
        self.steps.append(StepRecord.of(start, batch, seconds, breakdown, self.keep_batches))
        return StepOutput(tokens, seconds, breakdown)

    def execute_decode(self, pairs) -> None:
        """A plain decode step without a batch (`Scheduler.begin_decode`'s ``(1, context_len)``
        pairs, every sequence already known): predicted, timed and recorded as `execute`
        would, its sampled tokens all ``token``."""
        n = len(pairs)
        cost = self.predictor.predict(StepShape(self.model, pairs, n, 0, n, self.tp, self.ep))
        start = self.clock()
        self.clock.advance(cost.seconds)
        self.steps.append(StepRecord(start, cost.seconds, cost.breakdown, 0, n, n))

    def idle(self) -> None:
        """Nothing to reset: predicted steps carry no wall time."""

    def execute_logits(self, batch: ScheduledBatch):
        raise NotImplementedError("a simulated runner computes no logits (it has no weights); "
                                  "LLM.score needs a real model")


class Drafter:
    """Speculative decoding's drafter in a simulation (module docstring): `model`'s last layer
    as ``model``, ``k`` drafts, each accepted with `rate` when those before it were, and each
    sequence's running credit of accepted tokens (one `Drafter` per scheduler: the credits go
    by sequence id)."""

    def __init__(self, model: ModelSpec, k: int, rate: float) -> None:
        c = model.config
        self.model = replace(model, name=f"{model.name} drafter", config=replace(
            c, num_layers=1, layer_types=c.layer_types[-1:], first_dense_layers=0,
            dense_intermediate_size=0))
        self.k = int(k)
        self.acceptance_length = sum(float(rate) ** i for i in range(self.k + 1))
        self.token = filler_token(model)
        self.credit: Dict[int, float] = {}

    def add_cost(self, predictor, batch: ScheduledBatch, shape: StepShape, seconds: float,
                 breakdown: Dict[str, float], dp_samples: int = 0):
        """`seconds` and `breakdown` (the target's step, `shape`) with the drafter's passes
        added: once over `shape`'s tokens, then ``k - 1`` times over one token per sequence of
        `batch` that samples; under attention data parallelism the routed experts of those
        passes see `dp_samples`, every group's sampling sequences. Their engine overhead is
        left out: the one step carries it."""
        passes = [(replace(shape, model=self.model), 1)]
        ends = [s.num_computed_tokens + len(s.token_ids) + s.num_draft_tokens
                for s in batch.sequences if s.is_last_prefill_chunk]
        if self.k > 1 and ends:
            one = tuple([(1, e) for e in ends])
            passes.append((StepShape(self.model, one, len(one), 0, len(one), shape.tp,
                                     shape.ep, shape.dp, dp_samples if shape.dp > 1 else 0),
                           self.k - 1))
        breakdown = dict(breakdown)
        for draft_shape, times in passes:
            cost = predictor.predict(draft_shape)
            for family, part in cost.breakdown.items():
                if family != "overhead":
                    breakdown[family] = breakdown.get(family, 0.0) + times * part
                    seconds += times * part
        return seconds, breakdown

    def accepted(self, batch: ScheduledBatch, tokens):
        """`tokens` (`sampled`'s) with each decode's entry the accepted drafts and the token
        after them (module docstring)."""
        credit, length, token = self.credit, self.acceptance_length, self.token
        for seq_id in batch.finished_seq_ids:
            credit.pop(seq_id, None)
        out = list(tokens)
        for i, s in enumerate(batch.sequences):
            if s.num_draft_tokens and out[i] is not None:
                have = credit.get(s.seq_id)
                if have is None:
                    have = (s.seq_id * 0.6180339887498949) % 1.0
                have += length
                m = min(max(int(math.floor(have)), 1), 1 + s.num_draft_tokens)
                credit[s.seq_id] = have - m
                out[i] = (token,) * m
        return tuple(out)


class TimedRunner:
    """A real runner whose steps advance a `VirtualClock` by the wall time they took (module
    docstring). ``steps`` records every non-empty step with its measured seconds.

    With `pace` (the step seconds of an earlier run of the same workload) the clock advances by
    those instead, so the run repeats the earlier one's decisions exactly while its own step
    times are measured: two timings of the very same batches, the noise floor of a step."""

    def __init__(self, runner, clock: VirtualClock,
                 pace: Optional[Sequence[float]] = None) -> None:
        self.runner, self.clock = runner, clock
        if hasattr(runner, "time_families"):  # a GPU's breakdown times kernels, not launches
            runner.time_families()
        self.pace = None if pace is None else list(pace)
        self.steps: List[StepRecord] = []
        self._last_end: Optional[float] = None

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        began = time.perf_counter()
        output = self.runner.execute(batch)
        end = time.perf_counter()
        if batch.is_empty:
            return output
        # the work since the previous step's forward (its bookkeeping, this step's scheduling)
        seconds = end - (began if self._last_end is None else self._last_end)
        self._last_end = end
        start = self.clock()
        if self.pace is not None:
            if len(self.steps) >= len(self.pace):
                raise RuntimeError("pace: the run took more steps than the run it repeats")
            self.clock.advance(self.pace[len(self.steps)])
        else:
            self.clock.advance(seconds)
        self.steps.append(StepRecord.of(start, batch, seconds, dict(output.breakdown)))
        return replace(output, seconds=seconds)

    def execute_logits(self, batch: ScheduledBatch):
        return self.runner.execute_logits(batch)

    def idle(self) -> None:
        """The driver skipped an idle gap: the next step's time starts at its own forward."""
        self._last_end = None

    def close(self) -> None:
        """Shuts a tensor-parallel runner's workers down (`LLMEngine.close`)."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
