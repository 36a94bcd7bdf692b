"""Tensor parallelism's arithmetic, without torch: which part of a model each rank holds, and
`check_tp`, the one check of a tensor-parallel size (the engine's and the predictor's).

Sharding (Megatron style; `gnomon.engine.weight_shards.shard_weights` applies it)
  Each of ``N`` ranks holds its ``1/N`` of the query heads (Q rows of ``qkv``, their ``sinks``,
  their columns of ``o``), of the KV heads (replicated when ``N`` exceeds them: rank ``r`` holds
  KV head ``r // (N / num_kv_heads)``), of the intermediate size (gate and up rows of ``w13``,
  columns of ``w2``; experts are split on their intermediate dimension, not across ranks) and of
  the vocabulary, padded to a multiple of ``N`` (rows of ``embed`` and ``lm_head``). The router and
  the norms are replicated. A row-parallel bias (``o_bias``, ``w2_bias``) is added once: rank 0
  keeps it, the others hold zeros. MXFP4 experts whose intermediate slice is not a whole number
  of 32-element scale blocks are padded with zero codes to ``ceil(I / 32N) * 32N``, as vLLM pads.
  After ``o`` and after the MLP one all-reduce sums the ranks' partial outputs; the embedding is
  a masked lookup plus an all-reduce; the logits are all-gathered and the vocabulary padding cut.
  The processes and collectives that run the shards are `gnomon.engine.distributed`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gnomon.formats import MXFP4_BLOCK


def check_tp(config, tensor_parallel_size, arg: str = "tensor_parallel_size") -> int:
    """`tensor_parallel_size` if it can shard `config`: it must divide the query heads and the
    MLP/expert intermediate size, and divide the KV heads or be a multiple of them (which are
    then replicated). ValueError naming `arg` and the dimension otherwise. The engine and the
    predictor (``arg="tp"``) both check with it."""
    n = tensor_parallel_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{arg}: expected a positive int, got {n!r}")
    for what, size in (("attention heads (num_attention_heads)", config.num_heads),
                       ("intermediate size (intermediate_size)", config.intermediate_size),
                       ("dense layers' intermediate size (intermediate_size)",
                        config.dense_intermediate_size)):
        if size % n:
            raise ValueError(f"{arg}: {n} does not divide the {size} {what}")
    kv = config.num_kv_heads
    if kv % n and n % kv:
        raise ValueError(f"{arg}: {n} neither divides nor is a multiple of the {kv} KV heads "
                         f"(num_key_value_heads)")
    return n


def check_ep(config, tp: int, ep, arg: str = "ep", dp: int = 1) -> int:
    """`ep` if the experts can be split over `ep` groups of the ``tp x dp`` GPUs (expert
    parallelism: each group of ``tp dp / ep`` GPUs holds ``num_experts / ep`` whole experts, each
    split ``tp dp / ep`` ways on its intermediate size, as vLLM's, SGLang's and TensorRT-LLM's
    EP lay them out beside tensor- or data-parallel attention): 1, or a divisor of ``tp x dp``
    and of the experts of a MoE model. ValueError naming `arg` otherwise."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"{arg}: expected a positive int, got {ep!r}")
    gpus = tp * dp
    if ep > 1 and not config.is_moe:
        raise ValueError(f"{arg}: {ep}, but {config.architecture} has no experts to split")
    if gpus % ep:
        raise ValueError(f"{arg}: {ep} does not divide tp {tp} x dp {dp}, the GPUs the experts "
                         f"are split over")
    if config.is_moe and config.num_experts % ep:
        raise ValueError(f"{arg}: {ep} does not divide the {config.num_experts} experts")
    if config.is_moe and config.intermediate_size % (gpus // ep):
        raise ValueError(f"{arg}: {ep} leaves each expert split {gpus // ep} ways (tp {tp} x "
                         f"dp {dp} / ep), which does not divide its {config.intermediate_size} "
                         f"intermediate size")
    return ep


def check_dp(config, dp, arg: str = "dp") -> int:
    """`dp` if attention can run data-parallel over `dp` groups of GPUs (SGLang's
    ``--enable-dp-attention``, TensorRT-LLM's ``enable_attention_dp``, vLLM's data-parallel
    attention): each group serves its own requests through attention, and the MoE layers are
    shared by all of them, so `config` must have experts. ValueError naming `arg` otherwise."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"{arg}: expected a positive int, got {dp!r}")
    if dp > 1 and not config.is_moe:
        raise ValueError(f"{arg}: {dp}, but {config.architecture} has no MoE layers for the "
                         f"data-parallel groups to share; a dense model at dp {dp} is {dp} "
                         f"independent replicas (simulate one at 1/{dp} of the load)")
    return dp


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size` tensor-parallel ranks, and what of a model it holds."""

    rank: int = 0
    size: int = 1

    def span(self, n: int) -> slice:
        """This rank's part of a dimension of `n` (which `size` divides)."""
        step = n // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    def kv_heads(self, config) -> slice:
        """The KV heads this rank holds (one replicated head when `size` exceeds them)."""
        kv = config.num_kv_heads
        if self.size <= kv:
            return self.span(kv)
        head = self.rank // (self.size // kv)
        return slice(head, head + 1)

    def vocab(self, config) -> int:
        """The vocabulary padded to a multiple of `size`."""
        return -(-config.vocab_size // self.size) * self.size

    def intermediate(self, config, mxfp4: bool) -> int:
        """The intermediate size sharded: padded to whole MXFP4 scale blocks per rank when the
        experts are MXFP4."""
        size = config.intermediate_size
        if mxfp4 and size % (MXFP4_BLOCK * self.size):
            block = MXFP4_BLOCK * self.size
            size = -(-size // block) * block
        return size

    def local_config(self, config, mxfp4: bool = False):
        """`config` as this rank sees it: its heads, KV heads, intermediate size and vocabulary
        (what its weights and KV cache are shaped by)."""
        if self.size == 1:
            return config
        kv = self.kv_heads(config)
        return replace(config, num_heads=config.num_heads // self.size,
                       num_kv_heads=kv.stop - kv.start,
                       intermediate_size=self.intermediate(config, mxfp4) // self.size,
                       dense_intermediate_size=config.dense_intermediate_size // self.size,
                       vocab_size=self.vocab(config) // self.size)
