"""Hugging Face checkpoint helpers shared by the parity tests and the engine benchmark."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gnomon.ops import mxfp4_dequantize, mxfp4_quantize

MXFP4_QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"]}


def write_mxfp4_checkpoint(dense_folder, out_folder):
    """Rewrite the single-file gpt-oss checkpoint in `dense_folder` into `out_folder` in the
    hub's MXFP4 layout (experts as ``*_blocks`` / ``*_scales``, quantised by
    `gnomon.ops.mxfp4_quantize`). Returns the dequantised expert tensors {HF name: float32
    tensor in HF's dense layout}: the weights the MXFP4 checkpoint stands for."""
    dense_folder, out_folder = Path(dense_folder), Path(out_folder)
    shutil.copytree(dense_folder, out_folder)
    tensors = load_file(str(dense_folder / "model.safetensors"))
    out, dequant = {}, {}
    for name, t in tensors.items():
        if not name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            out[name] = t
            continue
        w = t.transpose(1, 2).contiguous()  # gnomon's w13 [E, 2I, H] / w2 [E, H, I]
        blocks, scales = mxfp4_quantize(w)
        e, n, k = w.shape
        out[f"{name}_blocks"] = blocks.view(e, n, k // 32, 16).contiguous()
        out[f"{name}_scales"] = scales.contiguous()
        dq = mxfp4_dequantize(blocks, scales, dtype=torch.float32)
        dequant[name] = dq.transpose(1, 2).contiguous()
    (out_folder / "model.safetensors").unlink()
    save_file(out, str(out_folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out_folder / "config.json").read_text())
    cfg["quantization_config"] = MXFP4_QUANTIZATION_CONFIG
    (out_folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return dequant


def hf_greedy(model, prompts, max_tokens):
    """transformers' greedy generation of exactly `max_tokens` tokens per prompt, one prompt at
    a time (no padding), as lists of token ids."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(tokens[0, len(p):].tolist())
    return out
