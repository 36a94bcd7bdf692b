"""The cost vocabulary: the ops of one step as the predictors price them, and the blocks an
architecture module (`gnomon.engine.models`) composes its step from. Torch-free and below the
layers (it imports none of them), so that the engine's model modules own their cost without
importing `gnomon.predict`, which only prices the ops.

An architecture's ``step_ops(ops)`` calls the blocks of `StepOps` in the order its runner
runs them, for T tokens of which R sample; the blocks count per GPU of ``tp`` and multiply
each layer's op by the layers that share its cost. Counting:

- activations in the model's dtype; linear weights in the pricing's linear dtype (FP8 one byte,
  its math FP8; NVFP4 4.5 and MXFP4 4.25 bits, their math FP4), routed experts of a dtype of
  their own in it (MXFP4 4.25 bits, math FP4; INT4 4.5 bits, weight-only at the bf16 peak);
  embedding, router and lm_head in the model's dtype;
- GEMMs read their weights once and their input and output activations once;
- MoE reads the expected number of distinct experts under uniform routing,
  ``E (1 - (1 - k/E)^T)`` for T tokens, and computes ``k`` experts per token, in two grouped
  GEMMs (w13 with K = hidden, w2 with K = intermediate / tp); under expert parallelism over
  ``ep`` of the GPUs each holds ``E / ep`` experts ``ep / tp`` of their width and, routing being
  balanced, computes ``1 / ep`` of the token-expert pairs; the tokens are already on every GPU
  (tensor-parallel attention), so the experts' outputs are summed by the same all-reduce;
  shared experts (DeepSeek's) are a dense gated MLP every token runs; a block may cover some of
  the layers (DeepSeek's first dense ones), its ops then multiplied by those;
- under attention data parallelism over ``dp`` groups of ``tp`` GPUs, one group's step runs its
  own T tokens through everything but the routed experts, which see the X tokens of every
  group: each of the ``tp dp`` GPUs holds ``E / ep`` experts ``ep / (tp dp)`` of their width and
  computes ``1 / ep`` of the X tokens' pairs. Each MoE layer dispatches the tokens to their
  experts' GPUs and combines the outputs back, two all-to-alls in the activation dtype: a token
  goes once to every GPU that holds at least one of its k experts (``1 - (1 - 1/ep)^k`` of them,
  its experts taken as independent uniform picks), and a GPU sends its group's T / tp tokens to
  the others and receives the others' for its experts, so it moves ``(N - 1)/N`` of
  ``max(X, dp T)`` tokens times that share (``N = tp dp``; the busiest group's GPUs bound it);
- lm_head, the final norm and sampling run only on the sequences that sample;
- with ``tp > 1`` (within a data-parallel group) what the runner does: an all-reduce of the
  hidden states after the vocab-parallel embedding and two per layer (after the attention and
  after the MLP), and an all-gather of the sampled rows' float32 logits (the vocabulary padded
  to a multiple of tp), each counted as the bytes one rank sends in a ring (`ring_bytes`,
  `Op.comm_bytes`).

The attention itself (the KV write and paged attention over each window's layers) depends on
every sequence's context, so `gnomon.predict.opcount` counts it per step.
"""

from __future__ import annotations

from typing import List, NamedTuple

LOGITS_BYTES = 4  # lm_head's output is float32
COLLECTIVES = ("all_reduce", "all_gather")


class Op(NamedTuple):  # a tuple: attention builds a few per step, 6x faster than a dataclass
    family: str  # one of gnomon.predict.cost.FAMILIES
    name: str
    flops: float
    bytes: float
    launches: int
    compute: str = "bfloat16"  # the math the FLOPs run in: "bfloat16", "fp8" or "fp4"
    comm_bytes: float = 0.0  # bytes one rank sends (communication ops only; `ring_bytes`)
    collectives: int = 0
    rows: int = 0  # what the kernel's efficiency depends on: a GEMM's M, the tokens per expert
    # of a grouped MoE GEMM, the keys per query of attention; 0 where nothing does
    depth: int = 0  # a GEMM's K (attention: the head dim)
    ranks: int = 0  # the GPUs a communication op spans
    kv_dtype: str = ""  # attention: the dtype its KV cache is read in


def kv_heads_per_gpu(config, tp: int) -> int:
    """KV heads one of `tp` ranks holds: split when tp divides them, replicated beyond
    (`gnomon.engine.parallel.Shard.kv_heads` says which)."""
    return max(config.num_kv_heads // tp, 1)


def ring_bytes(collective: str, payload: float, ranks: int) -> float:
    """The bytes one of `ranks` sends in a ring `collective` of `payload` bytes (all-reduce: the
    tensor each rank holds, ``2 (n - 1) / n`` of it; all-gather: the gathered tensor,
    ``(n - 1) / n``), what a link's bandwidth bounds (nccl-tests' bus bandwidth)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective: expected one of {', '.join(COLLECTIVES)}, got "
                         f"{collective!r}")
    share = (ranks - 1) / ranks
    return (2 * share if collective == "all_reduce" else share) * payload


class Pricing(NamedTuple):
    """The bytes and math a step's ops are counted in (`gnomon.predict.shapes.ModelSpec` makes
    one): activations, linear weights, their GEMMs' math, the routed experts' bytes per
    parameter and their grouped GEMMs' math (the linear layers' unless the experts hold a dtype
    of their own: "w4a8" for MXFP4 experts (MXFP8 activations where the chip has FP4 math,
    else weight-only), "w4a16" for INT4 ones, weight-only at the bf16 peak)."""

    activation_bytes: int
    linear_bytes: float
    linear_compute: str
    expert_bytes: float
    expert_compute: str


class StepOps:
    """Collects the ops of one step of `config` for T tokens, R of which sample, on one GPU of
    `tp`, the routed experts split over `ep` of the ``tp x dp`` GPUs
    (`gnomon.engine.parallel.check_ep`) and fed the X tokens of all `dp` data-parallel groups
    (T when ``dp`` is 1); an architecture module's ``step_ops`` calls its blocks in its
    runner's order."""

    def __init__(self, config, pricing: Pricing, tp: int, T: int, R: int, ep: int = 1,
                 dp: int = 1, X: int = 0) -> None:
        self.config, self.pricing, self.tp, self.T, self.R = config, pricing, tp, T, R
        self.ep, self.dp, self.X = ep, dp, (X or T)
        self.ops: List[Op] = []

    # ---- primitives ----------------------------------------------------------------------

    def gemm(self, family: str, name: str, k: int, n: int, *, weight_bytes=None,
             compute=None, layers=None) -> None:
        """Every layer's (or `layers` layers') GEMM of ``[T, k] x [k, n]`` over the step's T
        tokens, its weights in the linear dtype and math unless `weight_bytes` / `compute` say
        otherwise."""
        p, m = self.pricing, self.T
        layers = self.config.num_layers if layers is None else layers
        w = p.linear_bytes if weight_bytes is None else weight_bytes
        a = p.activation_bytes
        self.ops.append(Op(family, name, layers * 2.0 * m * k * n,
                           layers * (k * n * w + m * k * a + m * n * a), layers,
                           p.linear_compute if compute is None else compute, rows=m, depth=k))

    def elementwise(self, name: str, nbytes: float, launches: int, layers=None) -> None:
        """An op that moves ``nbytes`` per layer in ``launches`` kernels per layer."""
        layers = self.config.num_layers if layers is None else layers
        self.ops.append(Op("elementwise", name, 0.0, layers * nbytes, layers * launches))

    # ---- the blocks every decoder here shares --------------------------------------------

    @property
    def q_width(self) -> int:
        return self.config.q_size // self.tp

    @property
    def kv_width(self) -> int:
        return kv_heads_per_gpu(self.config, self.tp) * self.config.head_dim

    def embedding(self) -> None:
        a, H = self.pricing.activation_bytes, self.config.hidden_size
        self.elementwise("embedding", 2 * self.T * H * a, 1, layers=1)

    def attention_block(self, after_qkv=None) -> None:
        """A pre-norm decoder layer's non-attention ops around its attention: the two rms_norms
        (the residual add fused), the QKV projection, ``after_qkv(self)`` where an
        architecture transforms Q and K before RoPE, the rotary embedding and the O
        projection."""
        c, a = self.config, self.pricing.activation_bytes
        q, kv = self.q_width, self.kv_width
        self.elementwise("rms_norm", 2 * 4 * self.T * c.hidden_size * a, 2)
        self.gemm("gemm", "qkv_proj", c.hidden_size, q + 2 * kv)
        if after_qkv is not None:
            after_qkv(self)
        self.elementwise("rotary_embedding", 2 * self.T * (q + kv) * a, 1)
        self.gemm("gemm", "o_proj", q, c.hidden_size)

    def gated_mlp(self, intermediate=None, layers=None, family="gemm", name="") -> None:
        """The dense gated MLP (`intermediate` wide, the config's by default, on `layers`
        layers, every one by default): gate/up, the activation, down."""
        c, a = self.config, self.pricing.activation_bytes
        inter = (c.intermediate_size if intermediate is None else intermediate) // self.tp
        L = c.num_layers if layers is None else layers
        self.gemm(family, name + "gate_up_proj", c.hidden_size, 2 * inter, layers=L)
        self.elementwise(name + "silu_and_mul", 3 * self.T * inter * a, 1, layers=L)
        self.gemm(family, name + "down_proj", inter, c.hidden_size, layers=L)

    def moe(self, layers=None) -> None:
        """Router, top-k routing and the fused MoE's two grouped GEMMs over the experts, on
        `layers` layers (every one by default), the data-parallel groups' dispatch and combine,
        and the config's shared experts: a gated MLP ``shared_experts x intermediate_size`` wide
        that every token runs."""
        c, p, T, X = self.config, self.pricing, self.T, self.X
        L = c.num_layers if layers is None else layers
        a, H, ep, gpus = p.activation_bytes, c.hidden_size, self.ep, self.tp * self.dp
        E, k, inter = c.num_experts, c.top_k, c.intermediate_size * ep // gpus
        self.gemm("moe", "router", H, E, weight_bytes=a, compute="bfloat16", layers=L)
        self.ops.append(Op("moe", "topk_routing", L * 5.0 * T * E,
                           L * (T * E * a + 2 * T * k * 4), L))
        distinct = E * (1.0 - (1.0 - k / E) ** X) if X else 0.0
        # under expert parallelism this GPU holds 1/ep of them, and balanced routing sends it
        # 1/ep of the (token, expert) pairs
        weights = distinct / ep * H * inter * p.expert_bytes
        experts = p.expert_compute
        per_expert = round(X * k / distinct) if X else 0  # the grouped GEMMs' M
        self.ops.append(Op("moe", "fused_moe[w13]", L * 2.0 * X * k / ep * 2 * inter * H,
                           L * (2 * weights + X * H * a + X * k / ep * 2 * inter * a), L,
                           experts, rows=per_expert, depth=H))
        self.ops.append(Op("moe", "fused_moe[w2]", L * 2.0 * X * k / ep * inter * H,
                           L * (weights + X * k / ep * inter * a + X * H * a), L, experts,
                           rows=per_expert, depth=inter))
        if self.dp > 1:
            share = 1.0 - (1.0 - 1.0 / ep) ** k  # of the GPUs, those a token's experts are on
            moved = (gpus - 1) / gpus * share * max(X, self.dp * T) * H * a
            self.ops.append(Op("communication", "all_to_all", 0.0, 0.0, 2 * L,
                               comm_bytes=2 * L * moved, collectives=2 * L, ranks=gpus))
        if c.shared_experts:
            self.gated_mlp(c.shared_experts * c.intermediate_size, L, "moe", "shared_expert_")

    def decoder(self, mlp, after_qkv=None) -> None:
        """A pre-norm decoder's step: the embedding, every layer's `attention_block` (with
        ``after_qkv``) and ``mlp()`` (`gated_mlp` or `moe`), then the `tail`."""
        self.embedding()
        self.attention_block(after_qkv)
        mlp()
        self.tail()

    def tail(self) -> None:
        """The all-reduces of a tensor-parallel step, then the sampled rows' final norm,
        lm_head, sampling and the logits' all-gather."""
        c, a, T, R, tp = self.config, self.pricing.activation_bytes, self.T, self.R, self.tp
        H, L = c.hidden_size, c.num_layers
        if tp > 1:
            reduces = 2 * L + 1
            self.ops.append(Op("communication", "all_reduce", 0.0, 0.0, reduces,
                               comm_bytes=reduces * ring_bytes("all_reduce", T * H * a, tp),
                               collectives=reduces, ranks=tp))
        if not R:
            return
        self.elementwise("final_norm", 4 * R * H * a, 1, layers=1)
        V = c.vocab_size // tp
        self.ops.append(Op("gemm", "lm_head", 2.0 * R * H * V,
                           H * V * a + R * H * a + R * V * LOGITS_BYTES, 1, rows=R, depth=H))
        self.ops.append(Op("sampling", "sample", 5.0 * R * c.vocab_size,
                           3 * R * c.vocab_size * LOGITS_BYTES, 2))
        if tp > 1:
            self.ops.append(Op("communication", "all_gather", 0.0, 0.0, 1, comm_bytes=ring_bytes(
                "all_gather", R * -(-c.vocab_size // tp) * tp * LOGITS_BYTES, tp),
                collectives=1, ranks=tp))
