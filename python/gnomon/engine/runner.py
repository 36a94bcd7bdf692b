"""The real model runner: one `ScheduledBatch` in, one `StepOutput` out (DESIGN.md).

`ModelRunner` owns the paged KV cache and the RoPE cos/sin table, and runs any registered
architecture (`gnomon.engine.models`: Llama, Mixtral and gpt-oss built in), asking the
architecture's module for each layer's forward; it does not branch on the architecture. The
cache follows the model's
KV-cache groups (`gnomon.engine.kv_cache`): layer ``j`` of every group shares one K and one V
tensor ``[num_kv_blocks, block_size, num_kv_heads, head_dim]`` and reads it through its own
group's block table; with one group that is a tensor pair per layer.

    embedding
    per layer: the architecture's ``forward_layer``; the built-in ones are rms_norm (fused
               residual add from the second norm on) -> QKV matmul (+bias) -> rotary_embedding
               -> reshape_and_cache -> ONE paged_attention for the whole mixed batch (sliding
               window, sinks) -> O matmul (+bias) -> rms_norm (fused residual) -> SwiGLU MLP,
               or router matmul (+bias) -> topk_routing -> fused_moe
    final rms_norm and lm_head at the last position of each sequence that samples this step
    sample(logits, sequences) -> one token per sampling sequence, and its logprobs if asked

Inputs are built per step with numpy (per-sequence loops only: nothing per token in Python).
Sampling is a callable ``sample(logits float32 [R, V], sequences) -> SamplerOutput`` where
``sequences`` are the R `ScheduledSequence` that sample, in batch order, each carrying what
sampling needs (params, sample index, output position): its R token ids and per row the
logprobs or None. The default is greedy argmax; the engine plugs in
`gnomon.engine.sampler.Sampler.sample_sequences`. The logprobs reach `StepOutput.logprobs`.

Block tables arrive as deltas (`ScheduledSequence`); `tables` (a `BlockTables`) keeps each
sequence's tables, one per group, in one persistent int32 array, updated in place. Each step
has one slot mapping and one block table per group. paged_attention applies a sliding layer's
window when reading; with the hybrid cache the blocks behind it are released (-1 entries),
without it they stay.

`StepOutput.breakdown` is the step's time by op family (DESIGN.md), adding up to it:
``overhead`` (block copies, input prep and the call around them), ``attention``
(reshape_and_cache, paged_attention), ``gemm`` (the projections, dense MLP and lm_head), ``moe``
(router, topk_routing, fused_moe), ``elementwise`` (embedding, norms, rotary, activation),
``communication`` (a tensor-parallel shard's all-reduces and gathers, and rank 0's broadcast of
the batch; 0 on one rank) and ``sampling``.

Tensor parallelism: given a `Shard` (`gnomon.engine.parallel`) and its `Collectives`
(`gnomon.engine.distributed`), the runner holds one rank's weights and KV heads (``local``: the
config as the rank sees it) and runs the same forward, reducing after the row-parallel
projections and gathering the logits. Each op group is timed with the host clock as it returns,
which is its run time on the CPU; on an asynchronous device it would be launch time.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from gnomon._extras import require_torch

require_torch("the engine's model runner (a real run; a simulation needs none)")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gnomon import ops
from gnomon.engine import models
from gnomon.engine.batch import ScheduledBatch, ScheduledSequence, StepOutput
from gnomon.engine.block_tables import BlockTables
from gnomon.engine.config import ModelConfig
from gnomon.engine.kv_cache import KVCacheGroups
from gnomon.engine.models.layers import LayerKV, Model, StepInputs
from gnomon.engine.parallel import Shard
from gnomon.engine.rope import cos_sin_cache
from gnomon.engine.sampler import SamplerOutput
from gnomon.engine.weights import weight_shapes

SampleFn = Callable[[torch.Tensor, Sequence[ScheduledSequence]], SamplerOutput]
FAMILIES = ("overhead", "attention", "gemm", "moe", "elementwise", "communication", "sampling")


class _FamilyTimer:
    """Charges the time since the previous charge to a family. With `sync` (a GPU's
    synchronize) each reading waits for the device first, so a family is charged its kernels'
    time, not their launches'."""

    def __init__(self, sync: Optional[Callable[[], None]] = None) -> None:
        self.seconds = dict.fromkeys(FAMILIES, 0.0)
        # a charge is on every op group of the forward: no sync, no extra call
        self._now = time.perf_counter if sync is None else (
            lambda: (sync(), time.perf_counter())[1])
        self._last = self._now()

    def __call__(self, family: str) -> None:
        now = self._now()
        self.seconds[family] += now - self._last
        self._last = now


def greedy_sample(logits: torch.Tensor, sequences: Sequence[ScheduledSequence]) -> SamplerOutput:
    """Argmax per row (ties to the lowest id), no logprobs."""
    return SamplerOutput(logits.argmax(dim=-1), (None,) * logits.shape[0])


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return value


def resolve_device(device) -> torch.device:
    """`device` as a torch.device gnomon can run on: the CPU, or a GPU that torch sees when
    this build of gnomon has GPU kernels (ROCm GPUs are "cuda" to torch). Raises ValueError
    naming what is missing."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device: gnomon runs on 'cpu' or 'cuda[:N]' (ROCm GPUs are 'cuda' to "
                         f"torch), got {device!r}")
    from gnomon import _C

    if not _C.build_info()["gpu_backends"]:
        raise ValueError(f"device: {device!r}, but this build of gnomon has no GPU kernels; "
                         f"rebuild with -C cmake.define.GNOMON_GPU=cuda (or hip), see "
                         f"`gnomon info`")
    if not torch.cuda.is_available():
        raise ValueError(f"device: {device!r}, but torch {torch.__version__} sees no GPU")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return dev


class ModelRunner:
    """Runs a model's forward over paged KV for one scheduled step at a time.

    `weights` is the dict `load_weights` / `random_weights` return (gnomon's names, see
    `gnomon.engine.weights`). Floating weights are cast to `dtype` (default: the embedding's
    dtype) and everything is moved to `device`; MXFP4 codes and scales stay uint8.
    `max_position` bounds positions (default: the config's ``max_position_embeddings``).
    `kv_groups` lays out the cache (default: one full group, as a default `KVCacheManager`;
    ``config.kv_cache_groups()`` for the hybrid cache); it must match the groups of the
    allocator that schedules the batches. `shard` and `comm` make it one tensor-parallel rank
    (`gnomon.engine.parallel`, `gnomon.engine.distributed`): `weights` are then that rank's
    (`shard_weights`).
    """

    def __init__(self, config: ModelConfig, weights: Dict[str, torch.Tensor], *,
                 num_kv_blocks: int, block_size: int = 16,
                 device: Union[str, torch.device] = "cpu",
                 dtype: Union[None, torch.dtype] = None, sample: Optional[SampleFn] = None,
                 max_position: Optional[int] = None,
                 kv_groups: Optional[KVCacheGroups] = None, shard: Optional[Shard] = None,
                 comm=None) -> None:
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config: expected a ModelConfig, got {type(config).__name__}")
        if not isinstance(weights, dict):
            raise TypeError(f"weights: expected a dict of name -> tensor, got "
                            f"{type(weights).__name__}")
        self.config = config
        self.num_kv_blocks = _positive_int("num_kv_blocks", num_kv_blocks)
        self.block_size = _positive_int("block_size", block_size)
        self.max_position = _positive_int(
            "max_position", config.max_position_embeddings if max_position is None
            else max_position)
        self.device = resolve_device(device)
        self.timer_sync: Optional[Callable[[], None]] = None  # `time_families`
        if "embed" not in weights:
            raise KeyError("weights: missing 'embed' (expected gnomon's weight names, as "
                           "load_weights / random_weights return)")
        if dtype is None:
            dtype = weights["embed"].dtype
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype: expected torch.float32, float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        if sample is not None and not callable(sample):
            raise TypeError(f"sample: expected a callable (logits, sequences) -> token ids, got "
                            f"{type(sample).__name__}")
        self.sample: SampleFn = sample or greedy_sample

        mxfp4 = any(n.endswith("_scales") for n in weights)
        self.shard = shard or Shard()
        if (comm is None) != (self.shard.size == 1):
            raise ValueError(f"comm: expected the Collectives of a {self.shard.size}-rank group "
                             f"exactly when shard has more than one rank, got {comm!r}")
        self.comm = comm
        self.local = self.shard.local_config(config, mxfp4)
        expected = weight_shapes(self.local, mxfp4=mxfp4)
        for name, shape in expected.items():
            if name not in weights:
                raise KeyError(f"weights: missing {name!r} (shape {shape})")
            if tuple(weights[name].shape) != tuple(shape):
                raise ValueError(f"weights[{name!r}]: expected shape {tuple(shape)}, got "
                                 f"{tuple(weights[name].shape)}")
        w = {}
        for name in expected:
            t = weights[name]
            if t.dtype == torch.uint8:
                w[name] = t.to(self.device)
            elif name.endswith(".sinks"):
                w[name] = t.to(device=self.device, dtype=torch.float32).contiguous()
            else:
                w[name] = t.to(device=self.device, dtype=dtype)
        self.weights = w

        c = config
        groups = KVCacheGroups.full(c.num_layers) if kv_groups is None else kv_groups
        if not isinstance(groups, KVCacheGroups) or \
                sum(map(len, groups.layers)) != c.num_layers:
            raise ValueError(f"kv_groups: expected the KVCacheGroups of this model's "
                             f"{c.num_layers} layers, got {groups!r}")
        self.kv_groups = groups
        shape = (self.num_kv_blocks, self.block_size, self.local.num_kv_heads, c.head_dim)
        self.kv_caches: List[Tuple[torch.Tensor, torch.Tensor]] = [
            (torch.zeros(shape, dtype=dtype, device=self.device),
             torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(groups.layers_per_group)]
        windows = [c.sliding_window if t == "sliding" else None for t in c.layer_types]
        self.layer_kv = []  # per layer: its caches (shared by the groups' same positions)
        for i in range(c.num_layers):
            group, position = groups.slot_of(i)
            self.layer_kv.append(LayerKV(*self.kv_caches[position], group, windows[i]))
        self.model = Model(c, self.local, self.weights,
                           cos_sin_cache(c, self.max_position, device=self.device),
                           c.head_dim ** -0.5, self.shard, self.reduce)
        self._forward_layer = models.model_module(c.architecture).forward_layer
        self.tables = BlockTables(self.num_kv_blocks, windows=groups.windows)

    # ------------------------------------------------------------------ inputs
    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """Applies the batch's block-table deltas to `tables`, then builds the step's input
        tensors (vectorised; per-sequence loops only)."""
        seqs = batch.sequences
        nb = len(seqs)
        lens = np.fromiter((len(s.token_ids) for s in seqs), dtype=np.int64, count=nb)
        computed = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=nb)
        num_tokens = int(lens.sum())
        tokens = np.fromiter(itertools.chain.from_iterable(s.token_ids for s in seqs),
                             dtype=np.int64, count=num_tokens)
        if num_tokens and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ValueError(f"batch: token ids must lie in [0, {self.config.vocab_size}) (the "
                             f"vocabulary), got {int(tokens.min())}..{int(tokens.max())}")
        qsl = np.zeros(nb + 1, dtype=np.int64)
        np.cumsum(lens, out=qsl[1:])
        seq_of_token = np.repeat(np.arange(nb), lens)
        positions = np.arange(num_tokens, dtype=np.int64) - np.repeat(qsl[:-1] - computed, lens)
        seq_lens = computed + lens
        if num_tokens and int(seq_lens.max()) > self.max_position:
            raise ValueError(f"batch: a sequence reaches position {int(seq_lens.max()) - 1}, "
                             f"beyond max_position {self.max_position}")
        rows = self.tables.apply(batch)
        have = self.tables.lengths[rows]
        need = (seq_lens + self.block_size - 1) // self.block_size
        if (need > have).any():
            i = int(np.argmax(need > have))
            raise ValueError(f"batch: sequence {seqs[i].seq_id} needs {int(need[i])} blocks for "
                             f"{int(seq_lens[i])} tokens, its block table has {int(have[i])}")
        tables = np.ascontiguousarray(  # [G, B, W]
            self.tables.array[:, rows, :max(int(have.max(initial=0)), 1)])
        blocks = tables[:, seq_of_token, positions // self.block_size]
        if num_tokens and int(blocks.min()) < 0:
            g, t = np.argwhere(blocks < 0)[0]
            raise ValueError(f"batch: sequence {seqs[int(seq_of_token[t])].seq_id} writes "
                             f"position {int(positions[t])} into a released block (-1) of "
                             f"KV-cache group {int(g)}")
        slots = np.ascontiguousarray(blocks.astype(np.int64) * self.block_size
                                     + positions % self.block_size)
        sampling = np.fromiter((s.is_last_prefill_chunk for s in seqs), dtype=bool, count=nb)
        sample_rows = (qsl[1:] - 1)[sampling]
        dev = self.device
        return StepInputs(
            tokens=torch.from_numpy(tokens).to(dev),
            positions=torch.from_numpy(positions).to(dev),
            slot_mapping=torch.from_numpy(slots).to(dev),
            block_tables=torch.from_numpy(tables).to(dev),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
            query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
            sample_rows=torch.from_numpy(sample_rows).to(dev))

    # ------------------------------------------------------------------ forward
    def _copy_blocks(self, copies: Sequence[Tuple[int, int]]) -> None:
        if not copies:
            return
        pairs = torch.tensor(copies, dtype=torch.int64)
        if (pairs < 0).any() or (pairs >= self.num_kv_blocks).any():
            raise ValueError(f"batch.block_copies: block ids must lie in "
                             f"[0, {self.num_kv_blocks}), got {list(copies)}")
        src, dst = pairs[:, 0].to(self.device), pairs[:, 1].to(self.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]

    def forward(self, inputs: StepInputs, tick: Optional[_FamilyTimer] = None) -> torch.Tensor:
        """The hidden states after the final norm at the sampling rows, [R, H]; `tick`
        charges each op group's time to its family."""
        tick = tick or _FamilyTimer()
        c, w = self.config, self.weights
        h = self.embed(inputs.tokens, tick)
        residual = None
        for i in range(c.num_layers):
            h, residual = self._forward_layer(self.model, i, h, residual, inputs,
                                              self.layer_kv[i], tick)
        rows = inputs.sample_rows
        out = ops.rms_norm(h[rows], w["norm"], c.rms_norm_eps,
                           residual=residual[rows].contiguous())
        tick("elementwise")
        return out

    def embed(self, tokens: torch.Tensor, tick) -> torch.Tensor:
        """The embedding rows of `tokens`; a tensor-parallel rank looks up the tokens of its
        part of the vocabulary (zeros for the others) and the all-reduce sums the parts."""
        table = self.weights["embed"]
        if self.comm is None:
            return F.embedding(tokens, table)
        rows = table.shape[0]
        local = tokens - self.shard.rank * rows
        inside = ((local >= 0) & (local < rows)).unsqueeze(-1).to(table.dtype)
        h = F.embedding(local.clamp(0, rows - 1), table) * inside
        tick("elementwise")
        return self.reduce(h, tick)

    def reduce(self, t: torch.Tensor, tick) -> torch.Tensor:
        """The sum of every rank's `t` (the output of a row-parallel op); `t` itself on one."""
        if self.comm is None:
            return t
        self.comm.all_reduce(t)
        tick("communication")
        return t

    def compute_logits(self, hidden: torch.Tensor, tick=None) -> torch.Tensor:
        """lm_head on final-norm hidden states; float32 [R, V] (gathered from every rank's part
        of the vocabulary, its padding cut, under tensor parallelism)."""
        logits = F.linear(hidden, self.weights["lm_head"]).float()
        if self.comm is None:
            return logits
        if tick is not None:
            tick("gemm")
        logits = self.comm.all_gather_last(logits)[:, :self.config.vocab_size]
        if tick is not None:
            tick("communication")
        return logits

    def time_families(self) -> None:
        """From now on each step's breakdown by family waits for the GPU at every charge: its
        kernels' times, at the cost of a synchronize per family (a CPU needs none)."""
        if self.device.type == "cuda":
            self.timer_sync = torch.cuda.synchronize

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_logits(self, batch: ScheduledBatch) -> Tuple[torch.Tensor, Dict[str, float]]:
        """Block copies, then the forward; returns the float32 logits of the sequences that
        sample this step ([R, V], batch order) and the time by family so far."""
        if not isinstance(batch, ScheduledBatch):
            raise TypeError(f"batch: expected a ScheduledBatch, got {type(batch).__name__}")
        tick = _FamilyTimer(self.timer_sync)
        self._copy_blocks(batch.block_copies)
        if batch.is_empty:
            self.tables.apply(batch)  # drops the finished sequences' tables
            tick("overhead")
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32), tick.seconds
        inputs = self.prepare(batch)
        tick("overhead")
        hidden = self.forward(inputs, tick)
        logits = self.compute_logits(hidden, tick)
        tick("gemm")
        return logits, tick.seconds

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Runs one step and samples one token per sequence whose ``is_last_prefill_chunk``."""
        t0 = time.perf_counter()
        logits, breakdown = self.execute_logits(batch)
        t1 = time.perf_counter()
        # what no family's charge saw (the call, inference mode's entry and exit) is overhead,
        # so the families add up to the step
        breakdown["overhead"] += (t1 - t0) - sum(breakdown.values())
        if batch.is_empty:
            return StepOutput((), t1 - t0, breakdown)
        # the logits' rows, in batch order: a sequence that samples, or returns its logits
        rows = [s for s in batch.sequences if s.is_last_prefill_chunk]
        drawn = [j for j, s in enumerate(rows) if not s.sampling_params.prompt_logits]
        token_of, lp_of = {}, {}
        if drawn:
            out = self.sample(logits[drawn] if len(drawn) < len(rows) else logits,
                              [rows[j] for j in drawn])
            tokens, lps = out.token_ids.tolist(), list(out.logprobs)
            if len(tokens) != len(drawn) or len(lps) != len(drawn):
                raise ValueError(f"sample: returned {len(tokens)} tokens and {len(lps)} "
                                 f"logprobs rows for {len(drawn)} sampling sequences")
            token_of, lp_of = dict(zip(drawn, tokens)), dict(zip(drawn, lps))
        sampled, logprobs, kept = [], [], []
        j = 0
        for s in batch.sequences:
            row = j if s.is_last_prefill_chunk else -1
            j += s.is_last_prefill_chunk
            sampled.append(token_of.get(row))
            logprobs.append(lp_of.get(row))
            kept.append(logits[row].float().cpu() if row >= 0 and row not in token_of else None)
        t2 = time.perf_counter()
        breakdown["sampling"] = t2 - t1
        return StepOutput(tuple(sampled), t2 - t0, breakdown,
                          tuple(logprobs) if any(x is not None for x in logprobs) else None,
                          tuple(kept) if len(drawn) < len(rows) else None)
