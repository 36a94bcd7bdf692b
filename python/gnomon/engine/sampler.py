"""The sampler: one token per row of last-position logits, under each row's ``SamplingParams``.

Order of operations, per row (the order vLLM documents):

1. **Greedy** rows (``temperature == 0``) take ``argmax`` of the raw logits; ties go to the lowest
   token id. They draw no randomness.
2. **Temperature**: ``scaled = (logits - max(logits)) / temperature``. Subtracting the row max first
   keeps tiny temperatures finite (the kept maximum is exactly 0).
3. **Top-k** (``top_k > 0``): keep the ``top_k`` highest scaled logits. Ties at the boundary go to
   the lower token id, so exactly ``min(top_k, V)`` tokens survive (fewer only where the rest are
   ``-inf``).
4. **Top-p** (``top_p < 1``): over the softmax of the top-k survivors, sorted by descending
   probability, keep the smallest prefix whose mass is ``>= top_p``, i.e. token ``i`` survives when
   the mass strictly before it is ``< top_p`` (masses summed in float64). Tokens of equal
   probability are ranked by ascending id. The most likely token always survives.
5. **Min-p** (``min_p > 0``): drop tokens whose probability is ``< min_p * max probability``. The
   ratio ``p_i / p_max = exp(scaled_i)`` does not change when top-k or top-p renormalise, so this
   is computed on ``scaled`` directly: a token survives when ``scaled_i >= log(min_p)``.
6. **Draw** from the softmax of the surviving scaled logits by inverse-CDF sampling: one uniform
   ``u`` in ``[0, 1)`` per row, and the token is the first (in vocabulary order) whose cumulative
   weight exceeds ``u * total``. Filtered tokens have weight 0 and can never be chosen.

**Randomness.** A row's uniform is a pure function of the row alone. A seeded row's uniform is
``splitmix64(splitmix64(splitmix64(seed mod 2**64) ^ sample_index) ^ output_position)``, top 53
bits, computed in integer arithmetic: it does not depend on the other rows of the batch, on the
device, or on when the row is (re)computed, so a seeded request yields the same tokens alone or
in any batch, and again after preemption by recompute. ``sample_index`` is the completion's index
among the request's ``n`` samples, and ``output_position`` is the index of the token being drawn
within that completion (0 for the first generated token). Seeds that are equal modulo ``2**64``
are the same seed. Unseeded rows draw their uniforms from the sampler's own ``torch.Generator``
(seeded by ``Sampler(seed=...)``, or from the OS when ``seed`` is ``None``), in row order.

**Logprobs.** For rows with ``params.logprobs`` set, the sampled token's logprob and the top
``logprobs`` alternatives come from ``log_softmax`` of the *raw* logits: before temperature and
before any filter, the convention of Hugging Face and vLLM's default (``raw_logprobs``). The
alternatives are sorted by descending logprob, ties by ascending token id. ``logprobs=0`` returns
the sampled token's logprob with no alternatives.

**Bad logits are refused**, never guessed around: a NaN or ``+inf`` logit, or a row in which every
logit is ``-inf``, raises ``ValueError`` naming the rows. ``-inf`` elsewhere is a legitimate mask.

All filtering and drawing is vectorised over the rows with torch ops. Rows are grouped only by
what they need (greedy or not; top-k, top-p only, or neither; logprobs or not), and every op
works on each row independently, with masses summed by sequential cumulative sums rather than
width-dependent reductions, so a row's result is bit-identical in any batch. Top-k rows use
``torch.topk``; top-p-only rows look at their 1,024 highest tokens and sort the whole row only
when the nucleus is wider than that.

``exp`` of the scaled logits is taken in float32, so a surviving token
below ``1e-44`` of the top token's probability has weight 0.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from gnomon.engine.sampling_params import SamplingParams

__all__ = ["Sampler", "SamplerOutput", "TokenLogprobs", "seeded_uniform"]

_M64 = (1 << 64) - 1
_TOP_P_CAP = 1024  # top-p-only rows look at this many tokens before sorting the whole row


def _splitmix64(x: int) -> int:
    """The splitmix64 finaliser (Steele, Lea and Flood 2014), on Python ints modulo 2**64."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def seeded_uniform(seed: int, sample_index: int, output_position: int) -> float:
    """The uniform in ``[0, 1)`` that a seeded row draws: a pure function of its three arguments."""
    h = _splitmix64(seed & _M64)
    h = _splitmix64(h ^ (sample_index & _M64))
    h = _splitmix64(h ^ (output_position & _M64))
    return (h >> 11) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class TokenLogprobs:
    """One position's logprobs: the sampled token's, and the top alternatives (descending)."""

    token_id: int
    logprob: float
    top_token_ids: Tuple[int, ...]
    top_logprobs: Tuple[float, ...]


@dataclass(frozen=True)
class SamplerOutput:
    """``token_ids``: int64 ``[B]``; ``logprobs[i]`` is ``None`` unless row ``i`` asked for them."""

    token_ids: torch.Tensor
    logprobs: Tuple[Optional[TokenLogprobs], ...]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Sampler:
    """Samples one token per row. ``seed`` seeds the generator that unseeded rows draw from."""

    def __init__(self, seed: Optional[int] = None) -> None:
        if seed is not None and not _is_int(seed):
            raise ValueError(f"seed: expected None or an integer, got {seed!r}")
        self._generator = torch.Generator(device="cpu")
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed & _M64)

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                 sample_indices: Sequence[int], output_positions: Sequence[int]) -> SamplerOutput:
        return self.sample(logits, params, sample_indices, output_positions)

    def sample_sequences(self, logits: torch.Tensor, sequences) -> SamplerOutput:
        """The runner's ``sample``: row ``i`` is ``sequences[i]`` (a `ScheduledSequence`), its
        params, sample index and output position carried by the batch itself."""
        return self.sample(logits, [s.sampling_params for s in sequences],
                           [s.sample_index for s in sequences],
                           [s.output_position for s in sequences])

    @torch.no_grad()
    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               sample_indices: Sequence[int], output_positions: Sequence[int]) -> SamplerOutput:
        """Sample one token for each row of ``logits`` ``[B, V]``.

        ``params[i]``, ``sample_indices[i]`` (which of the request's ``n`` samples) and
        ``output_positions[i]`` (index of this token within its completion) describe row ``i``.
        """
        params, sample_indices, output_positions = self._validate(
            logits, params, sample_indices, output_positions)
        device = logits.device
        num_rows, vocab = logits.shape
        logits = logits.float()
        token_ids = torch.empty(num_rows, dtype=torch.int64, device=device)
        if num_rows == 0:
            return SamplerOutput(token_ids, ())

        greedy_rows = [i for i, p in enumerate(params) if p.temperature == 0]
        random_rows = [i for i, p in enumerate(params) if p.temperature != 0]
        if len(greedy_rows) == num_rows:
            token_ids = torch.argmax(logits, dim=-1)
        elif greedy_rows:
            idx = torch.tensor(greedy_rows, dtype=torch.int64, device=device)
            token_ids[idx] = torch.argmax(logits[idx], dim=-1)
        if random_rows:
            token_ids[torch.tensor(random_rows, dtype=torch.int64, device=device)] = \
                self._sample_random(logits, params, sample_indices, output_positions, random_rows)

        logprobs: List[Optional[TokenLogprobs]] = [None] * num_rows
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if lp_rows:
            self._logprobs(logits, token_ids, params, lp_rows, logprobs)
        return SamplerOutput(token_ids, tuple(logprobs))

    # ------------------------------------------------------------------------------------------

    @staticmethod
    def _validate(logits, params, sample_indices, output_positions):
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits: expected a torch.Tensor [B, V], got {type(logits).__name__}")
        if logits.dim() != 2:
            raise ValueError(f"logits: expected a 2-D tensor [B, V], "
                             f"got shape {tuple(logits.shape)}")
        if not logits.is_floating_point():
            raise ValueError(f"logits: expected a floating-point tensor, got {logits.dtype}")
        num_rows, vocab = logits.shape
        if vocab == 0 and num_rows > 0:
            raise ValueError("logits: expected a vocabulary of at least one token, got V=0")
        params = list(params)
        sample_indices = list(sample_indices)
        output_positions = list(output_positions)
        for name, seq in (("params", params), ("sample_indices", sample_indices),
                          ("output_positions", output_positions)):
            if len(seq) != num_rows:
                raise ValueError(f"{name}: expected one entry per logits row ({num_rows}), "
                                 f"got {len(seq)}")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params[{i}]: expected a SamplingParams, got {type(p).__name__}")
        for name, seq in (("sample_indices", sample_indices),
                          ("output_positions", output_positions)):
            for i, v in enumerate(seq):
                if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"{name}[{i}]: expected an integer >= 0, got {v!r}")
        sample_indices = [int(v) for v in sample_indices]
        output_positions = [int(v) for v in output_positions]
        # A row's max is finite exactly when the row has no NaN (max propagates it), no +inf,
        # and is not all -inf: one reduction instead of an elementwise isfinite pass.
        if num_rows and not bool(torch.isfinite(logits.amax(dim=-1)).all()):
            bad_nan = torch.isnan(logits).any(dim=-1)
            bad_pinf = (logits == math.inf).any(dim=-1)
            bad_all = (logits == -math.inf).all(dim=-1)
            for mask, what in ((bad_nan, "NaN"), (bad_pinf, "+inf"),
                               (bad_all, "-inf in every position (no token can be sampled)")):
                rows = mask.nonzero().flatten().tolist()
                if rows:
                    raise ValueError(f"logits: rows {rows} contain {what}; expected finite logits, "
                                     f"or -inf for masked tokens")
        return params, sample_indices, output_positions

    def _uniforms(self, params, sample_indices, output_positions, rows) -> torch.Tensor:
        """One uniform in [0, 1) per row, float64, on the CPU."""
        u = torch.empty(len(rows), dtype=torch.float64)
        unseeded = [j for j, i in enumerate(rows) if params[i].seed is None]
        if unseeded:
            u[torch.tensor(unseeded, dtype=torch.int64)] = torch.rand(
                len(unseeded), dtype=torch.float64, generator=self._generator)
        seeded = [j for j, i in enumerate(rows) if params[i].seed is not None]
        if seeded:
            u[torch.tensor(seeded, dtype=torch.int64)] = torch.tensor(
                [seeded_uniform(params[rows[j]].seed, sample_indices[rows[j]],
                                output_positions[rows[j]]) for j in seeded], dtype=torch.float64)
        return u

    def _sample_random(self, logits, params, sample_indices, output_positions, rows):
        device = logits.device
        vocab = logits.shape[1]
        sel = [params[i] for i in rows]
        x = logits[torch.tensor(rows, dtype=torch.int64, device=device)]

        # Temperature, relative to the row maximum: the kept maximum is exactly 0.
        scaled = x - x.max(dim=-1, keepdim=True).values
        if any(p.temperature != 1 for p in sel):
            scaled /= torch.tensor([p.temperature for p in sel], dtype=torch.float32,
                                   device=device)[:, None]

        # Top-k and top-p decide how many of the highest tokens a row keeps.
        with_k = [j for j, p in enumerate(sel) if p.top_k > 0]
        only_p = [j for j, p in enumerate(sel) if p.top_k == 0 and p.top_p < 1]
        if with_k:
            self._keep_top(scaled, with_k, sel, vocab)
        if only_p:
            self._keep_top(scaled, only_p, sel, vocab)
        if any(p.min_p > 0 for p in sel):  # min-p last, on the ratio exp(scaled) = p_i / p_max
            log_min_p = torch.tensor([math.log(p.min_p) if p.min_p > 0 else -math.inf
                                      for p in sel], dtype=torch.float32, device=device)
            scaled.masked_fill_(scaled < log_min_p[:, None], -math.inf)

        # Inverse-CDF draw from the surviving tokens, in vocabulary order. (exp underflows to 0
        # in float32 only for tokens below 1e-44 of the top one.)
        cdf = torch.cumsum(torch.exp(scaled), dim=-1, dtype=torch.float64)
        total = cdf[:, -1]
        u = self._uniforms(params, sample_indices, output_positions, rows).to(device)
        # u * total < total keeps the target below the last token with weight.
        target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
        return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)

    @staticmethod
    def _keep_top(scaled, group, sel, vocab) -> None:
        """Top-k then top-p for the rows ``group`` of ``scaled`` (in place: dropped -> -inf).

        Each row keeps its ``c`` highest tokens, ties going to the lower id. Mass is summed with
        sequential cumulative sums in float64, so a row's ``c`` does not depend on the other rows.
        Rows without top-k look at their ``_TOP_P_CAP`` highest tokens first and sort the whole
        row only when the nucleus is larger than that; both paths give the same ``c``.
        """
        device = scaled.device
        idx = torch.tensor(group, dtype=torch.int64, device=device)
        s = scaled[idx]
        ks = [sel[j].top_k for j in group]
        k = torch.tensor([min(kk, vocab) if kk > 0 else vocab for kk in ks], device=device)
        p = torch.tensor([sel[j].top_p for j in group], dtype=torch.float64, device=device)
        if ks[0] > 0:  # top-k rows: the mass of top-p is the mass of the k survivors
            vals = torch.topk(s, min(max(ks), vocab), dim=-1, sorted=True).values
            count = Sampler._top_count(vals, k, p, None)
        else:  # top-p only: the mass is the whole row's
            total = torch.cumsum(torch.exp(s), dim=-1, dtype=torch.float64)[:, -1:]
            width = min(vocab, _TOP_P_CAP)
            vals = torch.topk(s, width, dim=-1, sorted=True).values
            count = Sampler._top_count(vals, k, p, total)
            full = more = None
            if width < vocab:
                more = (count >= width).nonzero().flatten()
                if more.numel():
                    full = torch.sort(s[more], dim=-1, descending=True).values
                    count[more] = Sampler._top_count(full, k[more], p[more], total[more])
        threshold = vals.gather(1, (count.clamp(max=vals.shape[1]) - 1)[:, None])
        if ks[0] == 0 and full is not None:
            threshold[more] = full.gather(1, (count[more] - 1)[:, None])
        # Keep the first `count` of (value descending, id ascending).
        keep = s >= threshold
        room = count[:, None] - (s > threshold).sum(dim=-1, keepdim=True)
        if bool((keep.sum(dim=-1, keepdim=True) > count[:, None]).any()):  # ties at the edge
            tied = s == threshold
            keep = (s > threshold) | (tied & (torch.cumsum(tied, dim=-1) <= room))
        scaled[idx] = s.masked_fill(~keep, -math.inf)

    @staticmethod
    def _top_count(vals, k, p, total):
        """How many of the sorted ``vals`` survive top-k (``k``) then top-p (``p``)."""
        width = vals.shape[1]
        rank = torch.arange(width, device=vals.device)
        in_k = rank[None, :] < k[:, None]
        count = k.clamp(max=width)
        if not bool((p < 1).any()):
            return count
        e = torch.exp(vals).masked_fill(~in_k, 0.0).double()
        cs = torch.cumsum(e, dim=-1)
        if total is None:
            total = cs.gather(1, (count - 1)[:, None])
        keep = in_k & (((cs - e) < p[:, None] * total) | (p >= 1)[:, None])
        return keep.sum(dim=-1)

    @staticmethod
    def _logprobs(logits, token_ids, params, rows, out) -> None:
        device = logits.device
        idx = torch.tensor(rows, dtype=torch.int64, device=device)
        lp = torch.log_softmax(logits[idx], dim=-1)
        sampled = lp.gather(1, token_ids[idx].unsqueeze(1)).squeeze(1)
        kmax = min(max(params[i].logprobs for i in rows), lp.shape[1])
        top_vals = top_ids = None
        if kmax > 0:
            vals, order = torch.sort(lp, dim=-1, descending=True, stable=True)
            top_vals, top_ids = vals[:, :kmax].tolist(), order[:, :kmax].tolist()
        sampled_l, token_l = sampled.tolist(), token_ids[idx].tolist()
        for j, i in enumerate(rows):
            k = min(params[i].logprobs, kmax)
            out[i] = TokenLogprobs(
                token_id=token_l[j], logprob=sampled_l[j],
                top_token_ids=tuple(top_ids[j][:k]) if k else (),
                top_logprobs=tuple(top_vals[j][:k]) if k else ())
