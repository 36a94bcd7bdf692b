"""Running a workload through an `LLMEngine` on a `VirtualClock`, real or simulated.

`simulated_engine` builds the engine over a `SimulatedRunner` (KV blocks from the hardware's
capacity); `timed_engine` builds it over the real runner wrapped in a `TimedRunner`. Both go
through `run_workload`, which adds every request with its arrival time, steps the engine, jumps
the clock to the next arrival whenever a step finds nothing to run, and records what the metrics
need: every step, every token's time, KV usage after each step, preemptions and prefix hits.
"""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

from gnomon.engine.engine_config import EngineConfig
from gnomon.engine.llm import LLMEngine, RequestOutput
from gnomon.engine.parallel import check_dp, check_tp
from gnomon.engine.sampling_params import SamplingParams

from .data_parallel import AttentionDpBalance, DataParallelEngine, DataParallelRunner
from .engines import ServingPath
from .hardware import resolve_hardware
from .shapes import ModelSpec
from .simulated import (GPU_MEMORY_UTILIZATION, SimulatedRunner, StepRecord, TimedRunner,
                        VirtualClock, kv_blocks_for_hardware)
from .workloads import Workload, WorkloadRequest


@dataclass
class RunTrace:
    """What one run of a workload produced (times on the run's clock)."""

    workload: Workload
    steps: List[StepRecord]
    outputs: List[RequestOutput]  # in workload order
    token_times: Dict[str, Sequence[float]]  # request id -> the clock when each token came out
    kv_usage: List[Tuple[float, float]]  # (clock after a step, fraction of KV blocks in use)
    kv_windows: Tuple[Optional[int], ...]  # per KV-cache group: its window, None for full
    kv_group_blocks: List[Tuple[int, ...]]  # per kv_usage sample, blocks in use per group
    num_kv_blocks: int
    num_preemptions: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    wall_seconds: float  # how long the run took on this machine
    serving: ServingPath = ServingPath()  # the path outside the steps the run applied
    sent: Dict[str, float] = field(default_factory=dict)  # request id -> the client's send


def simulated_engine(model: ModelSpec, hardware, predictor,
                     config: EngineConfig = EngineConfig(), *, keep_batches: bool = False,
                     kv_memory: str = "total") -> Union[LLMEngine, DataParallelEngine]:
    """An `LLMEngine` configured by `config` over a `SimulatedRunner` (its parallelism from
    `config`) on a fresh `VirtualClock` at 0 (its step records keep their batches only with
    `keep_batches`). Its KV blocks are `config`'s ``num_kv_blocks``, or fill its
    ``gpu_memory_utilization`` (default `GPU_MEMORY_UTILIZATION`) of the HBM as `kv_memory`
    says (`kv_blocks_for_hardware`). With ``data_parallel_size`` > 1, a `DataParallelEngine`
    of that many such engines (each with those blocks) over one `DataParallelRunner`; it keeps
    no batches."""
    tp, ep, dp = (config.tensor_parallel_size, config.expert_parallel_size,
                  config.data_parallel_size)
    check_tp(model.config, tp, "tp")
    check_dp(model.config, dp)
    if dp > 1 and keep_batches:
        raise ValueError("keep_batches: a data-parallel simulation records its steps without "
                         "their batches")
    num_kv_blocks = config.num_kv_blocks
    if num_kv_blocks is None:
        num_kv_blocks = kv_blocks_for_hardware(
            model, resolve_hardware(hardware), block_size=config.block_size, tp=tp,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            gpu_memory_utilization=config.gpu_memory_utilization or GPU_MEMORY_UTILIZATION,
            enable_hybrid_kv=config.enable_hybrid_kv, kv_memory=kv_memory, dp=dp)
    clock = VirtualClock()
    if dp > 1:
        runner = DataParallelRunner(model, predictor, clock, tp=tp, ep=ep, dp=dp,
                                    num_speculative_tokens=config.num_speculative_tokens,
                                    draft_acceptance_rate=config.draft_acceptance_rate)
    else:
        runner = SimulatedRunner(model, predictor, clock, tp=tp, ep=ep,
                                 keep_batches=keep_batches,
                                 num_speculative_tokens=config.num_speculative_tokens,
                                 draft_acceptance_rate=config.draft_acceptance_rate)
    group = config.replace(dtype=model.dtype, num_kv_blocks=num_kv_blocks,
                           gpu_memory_utilization=None)
    if dp > 1:  # TensorRT-LLM skips batch waiting under attention DP (PyExecutor._schedule)
        group = group.replace(batch_wait_timeout_iters=0)
    groups = [LLMEngine(model.config, group, clock=clock, runner=runner) for _ in range(dp)]
    if dp == 1:
        return groups[0]
    balance = AttentionDpBalance(config.attention_dp_balance, config.attention_dp_timeout_iters,
                                 config.attention_dp_batching_wait_iters)
    return DataParallelEngine(groups, runner, balance)


def timed_engine(model: Union[str, ModelSpec], config: EngineConfig = EngineConfig(), *,
                 random_weights: bool = False,
                 pace: Optional[Sequence[float]] = None) -> LLMEngine:
    """A real `LLMEngine` configured by `config` (this machine's CPU; its
    ``tensor_parallel_size`` ranks) whose runner is wrapped in a `TimedRunner` on a fresh
    `VirtualClock` at 0 (`pace`: see `TimedRunner`). Close it."""
    clock = VirtualClock()
    source = model.config if isinstance(model, ModelSpec) else model
    engine = LLMEngine(source, config, clock=clock, random_weights=random_weights)
    engine.runner = TimedRunner(engine.runner, clock, pace)
    return engine


def run_workload(engine: Union[LLMEngine, DataParallelEngine], workload: Workload, *,
                 concurrency: Optional[int] = None,
                 serving: ServingPath = ServingPath(),
                 progress: Optional[Callable[[int, int], None]] = None) -> RunTrace:
    """Run `workload` to completion on `engine` (built by `simulated_engine` or
    `timed_engine`); ``progress(done, total)`` after each step.

    With `concurrency` N the client keeps at most N requests in flight, as ``vllm bench serve
    --max-concurrency`` does: a request is sent at its workload arrival time or, when N are in
    flight then, the moment the client sees one of them finish; its arrival (and so its TTFT)
    counts from that send. With every arrival at t=0 (rate inf) this is a closed loop of N
    users.

    `serving` is the path outside the steps (`ServingPath`): a request reaches the scheduler
    ``serving.ingress(prompt tokens)`` after its send, never before one sent earlier (the API
    server hands requests on in the order they came), and the client sees a step's tokens
    ``response_s`` after the step ends. An engine that schedules a step ahead
    (``schedule_ahead_steps`` 1: async scheduling, an overlap scheduler) chose the step that
    follows the running one when that one began, so a request that reached it since waits for
    both; one that finds the engine idle, or nothing else to run, goes in at once. With the
    engine's ``scheduler_recv_interval`` N above 1 (SGLang's ``--scheduler-recv-interval``:
    python/sglang/srt/managers/scheduler_recv_skipper.py, ``SchedulerRecvSkipper``), the
    scheduler takes in the requests that reached it only on a pass whose count has reached N,
    then counts from 0 again: each step adds 1 if it only decoded and N if it did prompt work
    (SGLang's weight 1,000), and an idle engine takes them in at once (its idle passes add 1
    each, microseconds apart). The metrics read it back from the trace."""
    clock, runner = engine.clock, engine.runner
    if not isinstance(clock, VirtualClock) or not isinstance(
            runner, (SimulatedRunner, TimedRunner, DataParallelRunner)):
        raise TypeError("engine: expected one built by simulated_engine or timed_engine "
                        "(a VirtualClock and a recording runner)")
    if concurrency is not None and (isinstance(concurrency, bool)
                                    or not isinstance(concurrency, int) or concurrency < 1):
        raise ValueError(f"concurrency: expected a positive int (requests in flight) or None, "
                         f"got {concurrency!r}")
    began = time.perf_counter()
    start = clock()
    requests = workload.requests
    sent = 0

    sent_at: Dict[str, float] = {}
    entered = -math.inf  # when the last request sent reached the scheduler
    on_way: Deque[Tuple[float, WorkloadRequest]] = deque()  # sent, not yet handed to the engine

    def send(limit: int, at: float) -> None:
        nonlocal sent, entered
        while sent < limit:
            r = requests[sent]
            sent_at[r.request_id] = max(start + r.arrival_time, at)
            entered = max(sent_at[r.request_id] + serving.ingress(len(r.prompt_token_ids)),
                          entered)
            on_way.append((entered, r))
            sent += 1
        if not ahead and interval == 1:  # the engine admits each at its arrival time itself
            hand_on(math.inf)

    def hand_on(until: float) -> None:  # the requests that reached the scheduler by `until`
        while on_way and on_way[0][0] <= until:
            at, r = on_way.popleft()
            engine.add_request(r.request_id, r.prompt_token_ids,
                               SamplingParams(max_tokens=r.output_len, temperature=0,
                                              ignore_eos=True), arrival_time=at)

    def chosen_at() -> float:
        """When the step about to begin was chosen: as the last one began, if it just ended and
        the engine schedules ahead; else now."""
        now = clock()
        if ahead and runner.steps:
            last = runner.steps[-1]
            if last.start + last.seconds >= now:
                return last.start
        return now

    total = workload.num_requests
    in_flight = total if concurrency is None else concurrency
    ahead = serving.schedule_ahead_steps
    interval = engine.engine_config.scheduler_recv_interval
    count = interval  # the scheduler's receive count (docstring); the first pass takes them in
    send(min(in_flight, total), start)
    kv_usage: List[Tuple[float, float]] = []
    kv_group_blocks: List[Tuple[int, ...]] = []
    done = 0  # requests the client has seen finish
    # Plain decode steps (every running sequence decodes, nothing else happens) need no batch
    # when the runner is simulated and keeps none: the scheduler runs them in place of
    # schedule() and update(), with the same allocator calls (`Scheduler.plain_decode_steps`).
    plain = isinstance(runner, SimulatedRunner) and not runner.keep_batches
    scheduler = engine.scheduler

    def stepped() -> None:  # after every step that ran: what the metrics read of it
        kv_usage.append((clock(), engine.kv.usage))
        kv_group_blocks.append(engine.kv.blocks_in_use)

    def receive(until: float) -> None:
        nonlocal count
        if count >= interval:
            count = 0
            hand_on(until)

    # The requests just added live for the whole run: frozen, the collector's passes do not
    # walk their prompts again and again (a tenth of a simulation's time otherwise).
    gc.freeze()
    try:
        while engine.has_unfinished_requests() or on_way:
            receive(chosen_at())
            for _ in range(scheduler.plain_decode_steps(runner.token) if plain else 0):
                if count >= interval:  # a receive pass: `receive` below takes in what is due
                    if on_way and on_way[0][0] <= chosen_at():
                        break
                    count = 0
                pairs = scheduler.begin_decode(clock())
                if pairs is None:
                    break
                runner.execute_decode(pairs)
                scheduler.end_decode(runner.token, clock())
                count += 1
                stepped()
                if progress is not None:
                    progress(done, total)
            receive(chosen_at())
            executed = len(runner.steps)
            for delta in engine.step():
                done += delta.finished
            ran = len(runner.steps) != executed
            if ran:
                count += interval if runner.steps[-1].num_prefill_tokens else 1
            if sent < total and sent - done < in_flight:
                send(min(done + in_flight, total), clock() + serving.response_s)
            if not ran:
                count = interval  # an idle engine takes in what reached it at once
                if on_way and on_way[0][0] <= clock():
                    hand_on(clock())  # the step chosen ahead had nothing in it: in at once
                    continue
                # nothing could run: skip to the next arrival
                arrival = min((t for t in (engine.next_arrival_time(),
                                           on_way[0][0] if on_way else None) if t is not None),
                              default=None)
                if arrival is None:
                    break
                clock.jump_to(arrival)
                runner.idle()
            else:
                stepped()
            if progress is not None:
                progress(done, total)
    finally:
        gc.unfreeze()
    stats = engine.kv.stats()

    token_times = {r.request_id: scheduler.get_request(r.request_id).sequences[0].token_times
                   for r in workload.requests}
    return RunTrace(workload=workload, steps=list(runner.steps),
                    outputs=[engine.get_output(r.request_id) for r in workload.requests],
                    token_times=token_times, kv_usage=kv_usage,
                    kv_windows=engine.kv.windows, kv_group_blocks=kv_group_blocks,
                    num_kv_blocks=engine.num_kv_blocks,
                    num_preemptions=engine.scheduler.num_preemptions,
                    prefix_queried_tokens=int(stats["queries"]),
                    prefix_hit_tokens=int(stats["hits"]), wall_seconds=time.perf_counter() - began,
                    serving=serving, sent=sent_at)
