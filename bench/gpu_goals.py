"""The GPU issue's performance goals, measured in one run on one GPU, each against its baseline
from the same run: device events, L2 flushed before every timed call (a write of twice the L2
size), the median of the timed calls.

- paged_attention decode: batch 64, contexts 4k-32k, Llama-3.1-8B heads (32 query / 8 KV of
  128), bf16: KV bytes read per second as a fraction of the device-to-device copy bandwidth
  (goal >= 0.85);
- mxfp4_gemm at M in {1, 4, 16}, N = K = 8192: time of torch's bf16 matmul (cuBLAS) on the same
  logical weight over gnomon's (goal >= 2.5x);
- fused_moe decode, gpt-oss-20b experts in MXFP4, batch 1 and 64: weight bytes touched per
  second as a fraction of the copy bandwidth (goal >= 0.6);
- prefill paged_attention (4 sequences of 2048 tokens): gnomon's throughput over torch SDPA's
  flash backend on the same tensors (goal >= 0.5).

Usage: python bench/gpu_goals.py [--out FILE]. Prints a table; writes JSON with --out.
"""

import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F

from gnomon import ops

REPEATS = 20


def timed(fn, flush, repeats=REPEATS):
    """Median seconds of `fn()` over `repeats` calls, each after an L2 flush."""
    fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(flush):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), flush)


def decode_attention(flush, copy_bw):
    g = torch.Generator(device="cuda").manual_seed(0)
    batch, hq, hkv, d, block = 64, 32, 8, 128, 16
    lens = torch.randint(4096, 32768 + 1, (batch,), generator=g, device="cuda")
    blocks = (lens + block - 1) // block
    tables = torch.zeros(batch, int(blocks.max()), dtype=torch.int32, device="cuda")
    starts = torch.cumsum(blocks, 0) - blocks
    for b in range(batch):
        tables[b, :blocks[b]] = torch.arange(int(starts[b]), int(starts[b] + blocks[b]),
                                             dtype=torch.int32, device="cuda")
    total = int(blocks.sum())
    kc = torch.randn(total, block, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    seq_lens = lens.to(torch.int32)
    seconds = timed(lambda: ops.paged_attention(q, kc, vc, tables, seq_lens, qsl), flush)
    kv_bytes = 2 * int(lens.sum()) * hkv * d * 2
    return {"seconds": seconds, "kv_bytes": kv_bytes,
            "fraction_of_copy": kv_bytes / seconds / copy_bw, "goal": 0.85}


def mxfp4_gemm(flush):
    out = {}
    n = k = 8192
    w, s = ops.mxfp4_quantize(torch.randn(n, k, device="cuda") / math.sqrt(k))
    dense = ops.mxfp4_dequantize(w, s, dtype=torch.bfloat16)
    for m in (1, 4, 16):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ours = timed(lambda: ops.mxfp4_gemm(a, w, s), flush)
        cublas = timed(lambda: a @ dense.t(), flush)
        out[f"M{m}"] = {"seconds": ours, "torch_bf16_seconds": cublas,
                        "speedup": cublas / ours, "goal": 2.5}
    return out


def fused_moe(flush, copy_bw):
    out = {}
    E, k, H, I = 32, 4, 2880, 2880  # gpt-oss-20b
    w13, s13 = ops.mxfp4_quantize(torch.randn(E, 2 * I, H, device="cuda") / math.sqrt(H))
    w2, s2 = ops.mxfp4_quantize(torch.randn(E, H, I, device="cuda") / math.sqrt(I))
    b13 = torch.zeros(E, 2 * I, device="cuda", dtype=torch.bfloat16)
    b2 = torch.zeros(E, H, device="cuda", dtype=torch.bfloat16)
    per_expert = (w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel())
    for tokens in (1, 64):
        hidden = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
        topk_w, topk_i = ops.topk_routing(torch.randn(tokens, E, device="cuda"), k,
                                          mode="topk_softmax")
        touched = int(torch.unique(topk_i).numel()) * per_expert
        seconds = timed(lambda: ops.fused_moe(
            hidden, w13, w2, topk_w, topk_i, activation="swiglu_oai",
            gate_up_layout="interleaved", w13_bias=b13, w2_bias=b2, w13_scales=s13,
            w2_scales=s2), flush)
        out[f"T{tokens}"] = {"seconds": seconds, "weight_bytes": touched,
                             "fraction_of_copy": touched / seconds / copy_bw, "goal": 0.6}
    return out


def prefill_attention(flush):
    seqs, length, hq, hkv, d, block = 4, 2048, 32, 8, 128, 16
    per_seq = length // block
    kc = torch.randn(seqs * per_seq, block, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    tables = torch.arange(seqs * per_seq, dtype=torch.int32, device="cuda").view(seqs, per_seq)
    q = torch.randn(seqs * length, hq, d, device="cuda", dtype=torch.bfloat16)
    qsl = torch.arange(0, seqs * length + 1, length, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((seqs,), length, dtype=torch.int32, device="cuda")
    ours = timed(lambda: ops.paged_attention(q, kc, vc, tables, seq_lens, qsl), flush)
    # the same K/V, contiguous per sequence, through SDPA's flash backend
    k = kc.view(seqs, length, hkv, d).repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
    v = vc.view(seqs, length, hkv, d).repeat_interleave(hq // hkv, dim=2).transpose(1, 2)
    qs = q.view(seqs, length, hq, d).transpose(1, 2)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = timed(lambda: F.scaled_dot_product_attention(qs, k, v, is_causal=True), flush)
    return {"seconds": ours, "sdpa_flash_seconds": flash, "throughput_ratio": flash / ours,
            "goal": 0.5}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    copy_bw = copy_bandwidth(flush)
    results = {"device": torch.cuda.get_device_name(0), "copy_bandwidth_bytes_per_s": copy_bw}
    for name, run in (("paged_attention_decode", lambda: decode_attention(flush, copy_bw)),
                      ("mxfp4_gemm", lambda: mxfp4_gemm(flush)),
                      ("fused_moe_decode", lambda: fused_moe(flush, copy_bw)),
                      ("paged_attention_prefill", lambda: prefill_attention(flush))):
        try:
            results[name] = run()
        except Exception as error:  # one failing goal must not hide the others' figures
            results[name] = {"error": f"{type(error).__name__}: {error}"}
        print(name, json.dumps(results[name], indent=1), flush=True)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s on {results['device']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
