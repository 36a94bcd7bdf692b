"""ModelRunner against an independent dense pure-torch reference (no paging, full causal
attention with GQA, per-token MoE loop), all float32.

Tolerance: last-position logits within atol 1e-4, rtol 1e-4 (the two paths differ only in
float32 summation order; logits are O(0.1) for these random tiny models). Greedy generations
must be token-identical.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from gnomon.engine.batch import ScheduledBatch, ScheduledSequence
from gnomon.engine.config import ModelConfig
from gnomon.engine.engine_config import EngineConfig
from gnomon.engine.rope import cos_sin_cache
from gnomon.engine.kv_cache import KVCacheManager
from gnomon.engine.kv_cache import KVCacheGroups, resolve_num_blocks
from gnomon.engine.runner import ModelRunner
from gnomon.engine.sampling_params import SamplingParams
from gnomon.engine.scheduler import Scheduler
from gnomon.engine.random_weights import random_weights
from gnomon.ops import mxfp4_dequantize

ATOL = RTOL = 1e-4
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PRESETS = ["tiny-llama", "tiny-mixtral", "tiny-gpt-oss"]


# ---------------------------------------------------------------------------- reference
def _rms(x, w, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _expert(cfg, w13, w2, b13, b2, x):
    gu = w13 @ x + (b13 if b13 is not None else 0)
    inter = w2.shape[1]
    if cfg.gate_up_layout == "interleaved":
        gate, up = gu[0::2], gu[1::2]
    else:
        gate, up = gu[:inter], gu[inter:]
    if cfg.activation == "swiglu_oai":
        gate = gate.clamp(max=7.0)
        up = up.clamp(-7.0, 7.0)
        act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    else:
        act = torch.nn.functional.silu(gate) * up
    return w2 @ act + (b2 if b2 is not None else 0)


def _moe(cfg, W, p, x):
    out = torch.zeros_like(x)
    logits = x @ W[p + "router"].T
    if p + "router_bias" in W:
        logits = logits + W[p + "router_bias"]
    for t in range(x.shape[0]):
        if cfg.routing == "topk_softmax":
            vals, ids = logits[t].topk(cfg.top_k)
            probs = vals.softmax(-1)
        else:
            probs_all = logits[t].softmax(-1)
            probs, ids = probs_all.topk(cfg.top_k)
            probs = probs / probs.sum()
        for pr, e in zip(probs.tolist(), ids.tolist()):
            b13 = W[p + "w13_bias"][e] if p + "w13_bias" in W else None
            b2 = W[p + "w2_bias"][e] if p + "w2_bias" in W else None
            out[t] += pr * _expert(cfg, W[p + "w13"][e], W[p + "w2"][e], b13, b2, x[t])
    return out


def reference_logits(cfg: ModelConfig, W, tokens) -> torch.Tensor:
    """Logits [L, V] at every position of one sequence."""
    tokens = torch.tensor(tokens)
    n = len(tokens)
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    table = cos_sin_cache(cfg, n)
    cos, sin = table[:, :d // 2], table[:, d // 2:]
    h = W["embed"][tokens].float()
    qpos = torch.arange(n)[:, None]
    kpos = torch.arange(n)[None, :]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        x = _rms(h, W[p + "attn_norm"], cfg.rms_norm_eps)
        qkv = x @ W[p + "qkv"].T
        if p + "qkv_bias" in W:
            qkv = qkv + W[p + "qkv_bias"]
        q = qkv[:, :hq * d].view(n, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(n, hkv, d)
        v = qkv[:, (hq + hkv) * d:].view(n, hkv, d)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        mask = kpos <= qpos
        if cfg.layer_types[i] == "sliding":
            mask = mask & (kpos > qpos - cfg.sliding_window)
        scores = scores.masked_fill(~mask, float("-inf"))
        if p + "sinks" in W:
            sink = W[p + "sinks"].float()[:, None, None].expand(hq, n, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, hq * d)
        o = attn @ W[p + "o"].T
        if p + "o_bias" in W:
            o = o + W[p + "o_bias"]
        h = h + o
        x = _rms(h, W[p + "mlp_norm"], cfg.rms_norm_eps)
        if cfg.is_moe:
            h = h + _moe(cfg, W, p, x)
        else:
            gate, up = (x @ W[p + "w13"].T).chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ W[p + "w2"].T
    return _rms(h, W["norm"], cfg.rms_norm_eps) @ W["lm_head"].T


def reference_greedy(cfg, W, prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(int(reference_logits(cfg, W, toks)[-1].argmax()))
    return toks[len(prompt):]


# ---------------------------------------------------------------------------- fixtures
def _model(name):
    cfg = ModelConfig.preset(name)
    W = random_weights(cfg, torch.float32, seed=7, mxfp4=False)
    return cfg, W


def _prompts(seed=0, lengths=(5, 17, 33, 1)):
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in lengths]


def _blocks(prompts, block_size, num_blocks, seed=1):
    """Shuffled, disjoint block tables big enough for each prompt (+ 20 spare tokens)."""
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    tables, at = [], 0
    for p in prompts:
        k = -(-(len(p) + 20) // block_size)
        tables.append(tuple(ids[at:at + k]))
        at += k
    return tables


def _seq(i, tokens, computed, table, last):
    return ScheduledSequence(seq_id=i, request_id=i, sample_index=0, token_ids=tuple(tokens),
                             num_computed_tokens=computed, block_ids=(table,),
                             is_last_prefill_chunk=last, sampling_params=GREEDY)


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", PRESETS)
def test_single_prefill_step_matches_reference(name):
    cfg, W = _model(name)
    prompts = _prompts()
    runner = ModelRunner(cfg, W, num_kv_blocks=64, block_size=4)
    tables = _blocks(prompts, 4, 64)
    batch = ScheduledBatch(sequences=tuple(_seq(i, p, 0, t, True)
                                           for i, (p, t) in enumerate(zip(prompts, tables))),
                           num_prefill_tokens=sum(map(len, prompts)))
    logits, _ = runner.execute_logits(batch)
    ref = torch.stack([reference_logits(cfg, W, p)[-1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=RTOL)
    out = runner.execute(ScheduledBatch())  # empty batch is fine
    assert out.sampled_token_ids == ()


@pytest.mark.parametrize("name", PRESETS)
def test_chunked_prefill_matches_reference(name):
    cfg, W = _model(name)
    prompts = _prompts(seed=3, lengths=(30, 9, 21))
    runner = ModelRunner(cfg, W, num_kv_blocks=64, block_size=4)
    tables = _blocks(prompts, 4, 64, seed=5)
    chunks = [7, 5, 11, 13]   # tokens per sequence per step (varying)
    done = [0] * len(prompts)
    got = {}
    for step_chunk in chunks:
        seqs = []
        for i, p in enumerate(prompts):
            if done[i] == len(p):
                continue
            n = min(step_chunk, len(p) - done[i])
            seqs.append(_seq(i, p[done[i]:done[i] + n], done[i], tables[i],
                             done[i] + n == len(p)))
            done[i] += n
        batch = ScheduledBatch(sequences=tuple(seqs),
                               num_prefill_tokens=sum(s.num_new_tokens for s in seqs))
        logits, _ = runner.execute_logits(batch)
        rows = [s.seq_id for s in seqs if s.is_last_prefill_chunk]
        assert logits.shape[0] == len(rows)
        for r, sid in enumerate(rows):
            got[sid] = logits[r]
    assert done == [len(p) for p in prompts]
    for i, p in enumerate(prompts):
        torch.testing.assert_close(got[i], reference_logits(cfg, W, p)[-1], atol=ATOL,
                                   rtol=RTOL)


def test_step_output_shape_and_breakdown():
    cfg, W = _model("tiny-llama")
    runner = ModelRunner(cfg, W, num_kv_blocks=16, block_size=4)
    p = _prompts(lengths=(6, 6))
    t = _blocks(p, 4, 16)
    batch = ScheduledBatch(sequences=(_seq(0, p[0][:3], 0, t[0], False),
                                      _seq(1, p[1], 0, t[1], True)), num_prefill_tokens=9)
    out = runner.execute(batch)
    assert out.sampled_token_ids[0] is None
    assert out.sampled_token_ids[1] == int(reference_logits(cfg, W, p[1])[-1].argmax())
    assert set(out.breakdown) == {"overhead", "attention", "gemm", "moe", "elementwise",
                                  "communication", "sampling"}
    assert out.breakdown["communication"] == 0  # one rank: no collective
    assert out.breakdown["moe"] == 0 and min(out.breakdown[f] for f in (
        "overhead", "attention", "gemm", "elementwise", "sampling")) > 0
    assert out.seconds == pytest.approx(sum(out.breakdown.values()), rel=1e-9)


def test_block_copies_copy_every_layer():
    cfg, W = _model("tiny-llama")
    runner = ModelRunner(cfg, W, num_kv_blocks=8, block_size=4)
    for k, v in runner.kv_caches:
        k[2].fill_(1.5)
        v[2].fill_(-2.5)
    runner.execute(ScheduledBatch(block_copies=((2, 5),)))
    for k, v in runner.kv_caches:
        assert (k[5] == 1.5).all() and (v[5] == -2.5).all()


@pytest.mark.parametrize("name", PRESETS)
def test_greedy_decode_with_scheduler_matches_reference(name):
    cfg, W = _model(name)
    prompts = _prompts(seed=11, lengths=(12, 3, 26))
    block_size = 4
    kv = KVCacheManager(num_blocks=48, block_size=block_size)
    # a small token budget forces chunked prefill mixed with decodes
    sched = Scheduler(kv, EngineConfig(max_model_len=128, max_num_seqs=4,
                                       max_num_batched_tokens=10))
    runner = ModelRunner(cfg, W, num_kv_blocks=48, block_size=block_size)
    for i, p in enumerate(prompts):
        sched.add(i, p, GREEDY)
    steps = mixed = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        if batch.is_empty:
            continue
        mixed += batch.num_prefill_tokens > 0 and batch.num_decode_tokens > 0
        sched.update(batch, runner.execute(batch))
        steps += 1
        assert steps < 500
    assert mixed > 0   # some step mixed prefill chunks with decodes
    for i, p in enumerate(prompts):
        ((toks, reason),) = sched.get_request(i).outputs()
        assert reason == "length"
        assert list(toks) == reference_greedy(cfg, W, p, 16), f"request {i}"


def test_kv_budget():
    cfg = ModelConfig.preset("tiny-llama")
    geometry = dict(block_size=16, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                    dtype_size=4)
    per = KVCacheGroups.full(cfg.num_layers).bytes_per_block(**geometry)
    assert per == 2 * 2 * 16 * 2 * 16 * 4
    assert resolve_num_blocks(kv_cache_bytes=10 * per + 5, bytes_per_block=per) == 10
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        resolve_num_blocks(kv_cache_bytes=per - 1, bytes_per_block=per)
    # gpt-oss's two groups of one layer each share one tensor pair: half a full block's bytes
    oss = ModelConfig.preset("tiny-gpt-oss")
    geometry.update(num_kv_heads=oss.num_kv_heads, head_dim=oss.head_dim)
    assert 2 * oss.kv_cache_groups().bytes_per_block(**geometry) == \
        oss.kv_cache_groups(False).bytes_per_block(**geometry)


def test_bad_arguments_are_named():
    cfg, W = _model("tiny-llama")
    with pytest.raises(TypeError, match="num_kv_blocks"):
        ModelRunner(cfg, W, num_kv_blocks=1.5)
    with pytest.raises(ValueError, match="block_size"):
        ModelRunner(cfg, W, num_kv_blocks=4, block_size=0)
    bad = dict(W)
    del bad["layers.0.qkv"]
    with pytest.raises(KeyError, match="layers.0.qkv"):
        ModelRunner(cfg, bad, num_kv_blocks=4)
    runner = ModelRunner(cfg, W, num_kv_blocks=4, block_size=4)
    with pytest.raises(TypeError, match="batch"):
        runner.execute("not a batch")
    short = ScheduledBatch(sequences=(_seq(0, range(9), 0, (0, 1), True),),
                           num_prefill_tokens=9)
    with pytest.raises(ValueError, match="block table"):
        runner.execute(short)
    oov = ScheduledBatch(sequences=(_seq(0, [cfg.vocab_size], 0, (0,), True),),
                         num_prefill_tokens=1)
    with pytest.raises(ValueError, match="token ids"):
        runner.execute(oov)


def test_mxfp4_gpt_oss_matches_reference_on_dequantised_weights():
    cfg = ModelConfig.preset("tiny-gpt-oss")
    Wq = random_weights(cfg, torch.float32, seed=9, mxfp4=True)
    assert Wq["layers.0.w13"].dtype == torch.uint8
    W = {n: t for n, t in Wq.items() if not n.endswith("_scales")}
    for i in range(cfg.num_layers):
        for m in ("w13", "w2"):
            name = f"layers.{i}.{m}"
            W[name] = mxfp4_dequantize(Wq[name], Wq[name + "_scales"], dtype=torch.float32)
    prompts = _prompts(seed=4, lengths=(14, 3))
    runner = ModelRunner(cfg, Wq, num_kv_blocks=32, block_size=4)
    tables = _blocks(prompts, 4, 32)
    batch = ScheduledBatch(sequences=tuple(_seq(i, p, 0, t, True)
                                           for i, (p, t) in enumerate(zip(prompts, tables))),
                           num_prefill_tokens=sum(map(len, prompts)))
    logits, _ = runner.execute_logits(batch)
    ref = torch.stack([reference_logits(cfg, W, p)[-1] for p in prompts])
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=RTOL)


def test_prefix_cache_fork_and_preemption_match_reference():
    """Shared prefixes (prefix-cache hits start prompts at num_computed > 0), n=2 samples
    (fork; the shared last block is copied on write through batch.block_copies) and a cache so
    small that the scheduler preempts: every greedy output equals the reference's."""
    cfg, W = _model("tiny-llama")
    base = _prompts(seed=21, lengths=(13,))[0]
    prompts = [base + [5, 6, 7], base + [9], base[:8] + [11, 12, 13, 14, 15]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, n=2)
    kv = KVCacheManager(num_blocks=14, block_size=4)
    sched = Scheduler(kv, EngineConfig(max_model_len=128, max_num_seqs=6,
                                       max_num_batched_tokens=12))
    runner = ModelRunner(cfg, W, num_kv_blocks=14, block_size=4)
    for i, p in enumerate(prompts):
        sched.add(i, p, params)
    copies = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        copies += len(batch.block_copies)
        if not batch.is_empty:
            sched.update(batch, runner.execute(batch))
        else:
            runner.execute(batch)
    assert sched.num_preemptions > 0 and copies > 0
    for i, p in enumerate(prompts):
        want = reference_greedy(cfg, W, p, 16)
        for toks, reason in sched.get_request(i).outputs():
            assert list(toks) == want and reason == "length", f"request {i}"


@pytest.mark.parametrize("name", PRESETS)
def test_bfloat16_runner_tracks_float32(name):
    """bf16 weights, activations and KV: logits (|logit| <= ~0.7 here) within 0.02 of the
    float32 runner's (observed ~0.005)."""
    cfg, W = _model(name)
    prompts = _prompts()
    tables = _blocks(prompts, 4, 64)
    batch = ScheduledBatch(sequences=tuple(_seq(i, p, 0, t, True)
                                           for i, (p, t) in enumerate(zip(prompts, tables))),
                           num_prefill_tokens=sum(map(len, prompts)))
    want, _ = ModelRunner(cfg, W, num_kv_blocks=64, block_size=4).execute_logits(batch)
    bf16 = ModelRunner(cfg, W, num_kv_blocks=64, block_size=4, dtype=torch.bfloat16)
    assert bf16.kv_caches[0][0].dtype == torch.bfloat16
    got, _ = bf16.execute_logits(batch)
    torch.testing.assert_close(got, want, atol=0.02, rtol=0)
