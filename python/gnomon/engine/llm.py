"""The serving (`LLMEngine`) and offline (`LLM`) APIs.

`LLMEngine` drives the step loop ``schedule(now) -> runner.execute(batch) -> update`` over a
`Scheduler`, reading time only from its ``clock``. Arrivals are admitted at step boundaries once
``clock()`` has passed their arrival time.

Runner surface
--------------
The engine touches the runner only through ``runner.execute(batch) -> StepOutput`` (`LLM.score`
too: its requests ask for their prompt's logits, which come back in ``StepOutput.logits``), so
a simulated runner answering the same call can stand in for the real `ModelRunner`. ``tests/engine/test_llm.py`` derives this set from this
file's source and checks the real runner answers it.

Outputs are incremental: ``step`` returns one `SampleDelta` per token sampled in that step (the
new token ids, and the finish reason when a sample finished), so a step's cost grows with the
batch, not with what the requests have generated so far. `get_output` builds the full
`RequestOutput` of a request when asked, and `LLM.generate` once per request at the end.

Time: ``step`` reads ``clock()`` once before scheduling (admissions, first-scheduled times) and
once after ``execute`` (first-token and finish times). A simulator with a virtual clock advances
that clock by the step's predicted duration inside its runner's ``execute`` (or between steps),
and jumps it to ``next_arrival_time()`` when ``step`` returns nothing.

Default KV budget: when neither ``num_kv_blocks`` nor ``kv_cache_bytes`` is given, the cache gets
``DEFAULT_KV_CACHE_BYTES`` (256 MiB), capped at what ``max_num_seqs`` sequences of
``max_model_len`` tokens could use, and never less than one sequence of ``max_model_len``.

Hybrid KV cache: with ``enable_hybrid_kv`` (the default) a model with sliding-window layers
(gpt-oss) gets one KV-cache group per attention window over one pool, and a sliding group keeps
only the blocks its window still sees (`gnomon.engine.kv_cache`). ``enable_hybrid_kv=False``
keeps every token's KV on every layer, as one full group: the same tokens, more memory.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from gnomon.costing import kv_heads_per_gpu

from . import models
from .config import PRESETS, ModelConfig, torch_dtype
from .config_json import DTYPE_BYTES
from .distributed import launched_by_torchrun
from .engine_config import EngineConfig
from .kv_cache import KVCacheManager, max_blocks_held
from .parallel import check_tp
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Request, SampleDelta

DEFAULT_KV_CACHE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class CompletionOutput:
    """One sample of a request: ``logprobs`` is None unless requested, else one
    `TokenLogprobs` per generated token."""
    index: int
    token_ids: Tuple[int, ...]
    text: Optional[str]
    finish_reason: Optional[str]
    logprobs: Optional[Tuple[object, ...]] = None


@dataclass(frozen=True)
class RequestMetrics:
    """Times on the engine's clock (None until they happen)."""
    arrival_time: float
    first_scheduled_time: Optional[float]
    first_token_time: Optional[float]
    finish_time: Optional[float]


@dataclass(frozen=True)
class RequestOutput:
    request_id: Union[str, int]
    prompt_token_ids: Tuple[int, ...]
    outputs: Tuple[CompletionOutput, ...]
    finished: bool
    metrics: RequestMetrics


def _check_real(config: EngineConfig) -> None:
    """Refuses the settings only a simulated engine has."""
    if config.expert_parallel_size > 1 or config.data_parallel_size > 1:
        raise ValueError(f"expert_parallel_size {config.expert_parallel_size}, "
                         f"data_parallel_size {config.data_parallel_size}: the real engine runs "
                         f"tensor parallelism only; gnomon simulate prices expert and attention "
                         f"data parallelism")
    if config.gpu_memory_utilization is not None:
        raise ValueError("gpu_memory_utilization: sizes a simulated engine's KV cache from its "
                         "GPU's memory; the real engine takes num_kv_blocks or kv_cache_bytes")
    if config.scheduler_recv_interval != 1:
        raise ValueError(f"scheduler_recv_interval: {config.scheduler_recv_interval}, but the "
                         f"real engine takes in new requests every step (1); gnomon simulate "
                         f"prices SGLang's interval")
    if config.num_speculative_tokens:
        raise ValueError(f"num_speculative_tokens: {config.num_speculative_tokens}, but the real "
                         f"engine has no drafter (0); gnomon simulate prices speculative decoding")


class LLMEngine:
    """Continuous-batching serving engine (see the module docstring).

    Its settings are `config` (an `EngineConfig`) with the keyword arguments `settings` (its
    fields) over it; ``engine_config`` holds them with every default resolved (the dtype,
    ``max_model_len`` and the KV blocks). ``runner`` defaults to a real `ModelRunner` over
    ``model``'s weights (``random_weights``: a preset's, drawn at random) whose ``sample`` is
    the real `Sampler` (per sequence: its params, sample index and output position, which the
    batch carries), its logprobs returned in `StepOutput.logprobs`. A runner passed in must
    have been built with the engine's KV geometry (``num_kv_blocks``, ``block_size``,
    ``kv_groups``) and parallelism, and samples by itself; its ``StepOutput.logprobs`` (if
    any) reach the outputs.
    """

    def __init__(self, model, config: Optional[EngineConfig] = None, *,
                 clock: Optional[Callable[[], float]] = None, runner=None,
                 random_weights: bool = False, **settings) -> None:
        if config is not None and not isinstance(config, EngineConfig):
            raise TypeError(f"config: expected an EngineConfig, got {type(config).__name__}")
        config = EngineConfig.from_mapping(settings, "LLMEngine", base=config)
        if clock is not None and not callable(clock):
            raise TypeError(f"clock: expected a callable returning seconds, got {clock!r}")
        self.clock = clock or time.monotonic
        if runner is None:  # refuse what gnomon cannot run before building weights
            from .runner import resolve_device
            resolve_device(config.device)
            _check_real(config)
        if isinstance(model, ModelConfig):
            model_config, folder = model, None
        elif isinstance(model, (str, os.PathLike)):
            name = os.fspath(model)
            if os.path.isdir(name):
                folder = name
            elif name in PRESETS:
                folder = None
                if not random_weights and runner is None:
                    raise ValueError(f"model: {name!r} is a preset with no checkpoint; pass "
                                     f"random_weights=True, or a model folder")
            else:
                raise ValueError(f"model: expected a model folder (config.json + safetensors) or "
                                 f"a preset ({', '.join(PRESETS)}), got {name!r}")
            model_config = ModelConfig.from_model(name)
        else:
            raise TypeError(f"model: expected a folder path or preset name, got "
                            f"{type(model).__name__}")
        reason = models.simulation_only(model_config.architecture)
        if runner is None and reason:
            raise ValueError(f"model: {reason}; gnomon simulate can price it")
        if runner is None and (model_config.quantization in ("fp8", "nvfp4", "mxfp4-dense",
                                                             "int4")
                               or model_config.kv_cache_dtype == "fp8"):
            what = (f"{model_config.quantization} weights" if model_config.quantization
                    != "mxfp4" and model_config.quantization else "an fp8 KV cache")
            raise ValueError(f"model: {what} (quantization_config): gnomon has no kernel for "
                             f"them yet, so the real engine cannot run this model; gnomon "
                             f"simulate can price it")
        tp = check_tp(model_config, config.tensor_parallel_size, "tensor_parallel_size")
        if runner is None and launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) != tp:
            raise ValueError(f"tensor_parallel_size: {tp}, but torchrun started "
                             f"WORLD_SIZE={os.environ['WORLD_SIZE']} processes")
        self.config = model_config
        self.folder = folder
        max_model_len = (model_config.max_position_embeddings if config.max_model_len is None
                         else config.max_model_len)
        if max_model_len > model_config.max_position_embeddings:
            raise ValueError(f"max_model_len: {max_model_len} exceeds the model's maximum "
                             f"position {model_config.max_position_embeddings}")
        self.kv_groups = model_config.kv_cache_groups(config.enable_hybrid_kv)
        dtype = model_config.torch_dtype if config.dtype == "auto" else config.dtype
        # a budget in bytes is each rank's, for its KV heads
        geometry = dict(num_kv_heads=kv_heads_per_gpu(model_config, tp),
                        head_dim=model_config.head_dim, dtype_size=DTYPE_BYTES[dtype],
                        block_size=config.block_size)
        num_kv_blocks = config.num_kv_blocks
        if num_kv_blocks is None and config.kv_cache_bytes is None:
            per_seq = max_blocks_held(self.kv_groups.windows, max_model_len,
                                      block_size=config.block_size,
                                      max_step_tokens=config.max_num_batched_tokens)
            per_block = self.kv_groups.bytes_per_block(**geometry)
            n = min(DEFAULT_KV_CACHE_BYTES // per_block, config.max_num_seqs * per_seq)
            num_kv_blocks = max(n, per_seq, 1)
        self.kv = KVCacheManager.from_budget(
            groups=self.kv_groups, **geometry, num_kv_blocks=num_kv_blocks,
            kv_cache_bytes=config.kv_cache_bytes,
            enable_prefix_caching=config.enable_prefix_caching)
        # what this engine runs with, every default resolved: its dtype, length and KV blocks
        self.engine_config = config.replace(dtype=dtype, max_model_len=max_model_len,
                                            num_kv_blocks=self.kv.num_blocks, kv_cache_bytes=None,
                                            gpu_memory_utilization=None)
        self.scheduler = Scheduler(self.kv, self.engine_config,
                                   eos_token_ids=model_config.eos_token_ids,
                                   vocab_size=model_config.vocab_size)
        self.is_driver = True
        if runner is None:
            from .launch import RunnerBuilder, start_runner
            from .sampler import Sampler

            build = RunnerBuilder(model_config, folder, bool(random_weights), self.engine_config,
                                  self.kv_groups, models.module_path(model_config.architecture))
            runner = start_runner(build, Sampler(config.seed).sample_sequences)
            # None: a torchrun rank other than 0, which served rank 0's step loop
            self.is_driver = runner is not None
        self.runner = runner
        self._requests: Dict[object, Request] = {}
        self.detokenize: Optional[Callable[[Sequence[int]], str]] = None

    # ------------------------------------------------------------------ API
    def add_request(self, request_id, prompt, params: Optional[SamplingParams] = None,
                    arrival_time: Optional[float] = None) -> None:
        """Queue a request (prompt: token ids); arrival defaults to ``clock()``."""
        params = SamplingParams() if params is None else params
        if arrival_time is None:
            arrival_time = float(self.clock())
        if isinstance(prompt, str):
            raise TypeError("prompt: LLMEngine takes token ids; tokenize strings first (LLM does)")
        req = self.scheduler.add(request_id, list(prompt), params, arrival_time)
        self._requests[request_id] = req

    def abort_request(self, request_id) -> None:
        self.scheduler.abort(request_id)

    def close(self) -> None:
        """Shuts a tensor-parallel engine's workers down and leaves its process group (nothing
        to do on one rank); the engine cannot step after it."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
        self.runner = None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_arrival_time(self) -> Optional[float]:
        return self.scheduler.next_arrival_time()

    @property
    def dtype(self):
        """The activation dtype as a torch.dtype (imports torch)."""
        return torch_dtype(self.engine_config.dtype, "dtype")

    def step(self) -> List[SampleDelta]:
        """One step: admit arrivals up to ``clock()``, schedule, execute, update. Returns one
        `SampleDelta` per token sampled this step (module docstring)."""
        if self.runner is None:
            raise RuntimeError("step: this engine is closed, or it is a torchrun rank other "
                               "than 0 (those serve rank 0's engine; generate on rank 0)")
        now = float(self.clock())
        batch = self.scheduler.schedule(now)
        if batch.is_empty:
            if batch.finished_seq_ids:  # lets the runner drop per-sequence state
                self.runner.execute(batch)
            return []
        output = self.runner.execute(batch)
        return self.scheduler.update(batch, output, now=float(self.clock()))

    def get_output(self, request_id) -> RequestOutput:
        return self._output(self.scheduler.get_request(request_id))

    @property
    def num_free_blocks(self) -> int:
        return self.kv.num_free_blocks

    @property
    def num_kv_blocks(self) -> int:
        return self.kv.num_blocks

    def _output(self, req: Request) -> RequestOutput:
        outs = []
        by_index = {s.sample_index: s for s in req.sequences}
        for i in range(req.params.n):
            s = by_index.get(i)
            ids = s.output_token_ids if s is not None else ()
            lps = tuple(s.output_logprobs) if (s is not None and req.params.logprobs
                                               is not None) else None
            text = self.detokenize(list(ids)) if self.detokenize is not None else None
            outs.append(CompletionOutput(i, tuple(ids), text,
                                         s.finish_reason if s is not None else None, lps))
        m = RequestMetrics(req.arrival_time, req.first_scheduled_time, req.first_token_time,
                           req.finish_time)
        return RequestOutput(req.request_id, tuple(req.prompt_token_ids), tuple(outs),
                             req.finished, m)


class LLM:
    """Offline batch generation over `LLMEngine`: `model`, then an `EngineConfig` or its fields
    as keyword arguments (``tensor_parallel_size=2``, ``dtype="float32"``, ...)."""

    def __init__(self, model, config: Optional[EngineConfig] = None, *,
                 random_weights: bool = False, **settings) -> None:
        self.engine = LLMEngine(model, config, random_weights=random_weights, **settings)
        self.tokenizer = None
        folder = self.engine.folder
        if folder is not None and os.path.isfile(os.path.join(folder, "tokenizer.json")):
            from tokenizers import Tokenizer
            self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
            self.engine.detokenize = self.tokenizer.decode
        self._counter = 0

    @property
    def num_free_blocks(self) -> int:
        return self.engine.num_free_blocks

    @property
    def next_request_id(self) -> str:
        """The id the next prompt passed to `generate` gets."""
        return f"llm-{self._counter}"

    @property
    def num_kv_blocks(self) -> int:
        return self.engine.num_kv_blocks

    @property
    def is_driver(self) -> bool:
        """False on a torchrun rank other than 0, which served rank 0's engine and is done."""
        return self.engine.is_driver

    def close(self) -> None:
        """Shuts tensor-parallel workers down (`LLMEngine.close`)."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _tokenize(self, prompts) -> List[List[int]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise TypeError("prompts: expected a list of prompts (token-id lists or strings)")
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise ValueError(f"prompts[{i}]: a string prompt needs a tokenizer.json in "
                                     f"the model folder; pass token ids instead")
                out.append(self.tokenizer.encode(p).ids)
            else:
                ids = list(p)
                if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise ValueError(f"prompts[{i}]: expected a non-empty list of int token ids")
                bad = [t for t in ids if not 0 <= t < self.engine.config.vocab_size]
                if bad:
                    raise ValueError(f"prompts[{i}]: token ids must lie in [0, "
                                     f"{self.engine.config.vocab_size}), got {bad[0]}")
                out.append(ids)
        return out

    def generate(self, prompts, sampling_params=None, *,
                 progress: Optional[Callable[[int, int], None]] = None) -> List[RequestOutput]:
        """Generate for every prompt; outputs in prompt order. ``progress(done, total)`` is
        called after each step."""
        ids = self._tokenize(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(ids)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(ids)
        elif isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(ids):
                raise ValueError(f"sampling_params: expected one SamplingParams or one per prompt "
                                 f"({len(ids)}), got {len(sampling_params)}")
            params = list(sampling_params)
        else:
            raise TypeError(f"sampling_params: expected a SamplingParams or a list of them, got "
                            f"{type(sampling_params).__name__}")
        return [self.engine.get_output(r) for r in self._run(ids, params, "llm", progress)]

    def _run(self, ids, params, prefix: str, progress=None) -> List[str]:
        """Adds one request per prompt, all or none (a refused one aborts those added before
        it, and the error propagates), then steps the engine until every request finishes;
        their request ids, in prompt order."""
        eng = self.engine
        rids = []
        try:
            for p, sp in zip(ids, params):
                rid = f"{prefix}-{self._counter}"
                self._counter += 1
                eng.add_request(rid, p, sp)
                rids.append(rid)
        except Exception:
            for rid in rids:
                eng.abort_request(rid)
            while eng.has_unfinished_requests():
                eng.step()
            raise
        done = 0
        while eng.has_unfinished_requests():
            for delta in eng.step():
                done += delta.finished
            if progress is not None:
                progress(done, len(rids))
        return rids

    def score(self, prompts):
        """Last-position logits of each prompt, a float32 torch tensor ``[B, vocab]``: each
        prompt is a request through the scheduler that asks for them in place of a sample
        (`SamplingParams.prompt_logits`), so it is batched, chunked and prefix-cached as any."""
        import torch

        ids = self._tokenize(prompts)
        eng = self.engine
        params = SamplingParams(temperature=0, max_tokens=1, prompt_logits=True)
        rids = self._run(ids, [params] * len(ids), "score")
        rows = [eng.scheduler.get_request(r).prompt_logits for r in rids]
        if any(row is None for row in rows):
            raise RuntimeError("score: the runner returned no logits (a simulated runner has no "
                               "weights; LLM.score needs a real model)")
        return torch.stack(rows) if rows else torch.empty(0, eng.config.vocab_size)
