"""ModelConfig parsing, presets and the RoPE cos/sin table."""

import dataclasses
import json
import math

import pytest
import torch

from gnomon.engine.config import PRESETS, SUPPORTED_ARCHITECTURES, ModelConfig, preset_json
from gnomon.engine.rope import cos_sin_cache, rope_inv_freq


# ---- presets ---------------------------------------------------------------------------------

# the models' published config.json (Hugging Face hub): layers, hidden, heads, kv heads,
# head dim, intermediate, experts, top-k, vocab, rope theta
REFERENCE = {
    "llama-3.1-8b": ("LlamaForCausalLM", 32, 4096, 32, 8, 128, 14336, 0, 0, 128256, 500000.0),
    "llama-3.1-70b": ("LlamaForCausalLM", 80, 8192, 64, 8, 128, 28672, 0, 0, 128256, 500000.0),
    "mixtral-8x7b": ("MixtralForCausalLM", 32, 4096, 32, 8, 128, 14336, 8, 2, 32000, 1e6),
    "gpt-oss-20b": ("GptOssForCausalLM", 24, 2880, 64, 8, 64, 2880, 32, 4, 201088, 150000.0),
    "gpt-oss-120b": ("GptOssForCausalLM", 36, 2880, 64, 8, 64, 2880, 128, 4, 201088, 150000.0),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_presets_match_reference(name):
    c = ModelConfig.preset(name)
    got = (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
           c.intermediate_size, c.num_experts, c.top_k, c.vocab_size, c.rope_theta)
    assert got == REFERENCE[name]
    assert c.torch_dtype == "bfloat16" and c.dtype == torch.bfloat16
    assert not c.tie_word_embeddings
    if name.startswith("llama"):
        s = c.rope_scaling
        assert (s.rope_type, s.factor, s.low_freq_factor, s.high_freq_factor,
                s.original_max_position_embeddings) == ("llama3", 8.0, 1.0, 4.0, 8192)
        assert c.layer_types == ("full",) * c.num_layers and c.routing is None
        assert c.activation == "silu" and not c.attention_bias and not c.has_sinks
    elif name.startswith("mixtral"):
        assert c.rope_scaling is None and c.routing == "softmax_topk"
        assert c.gate_up_layout == "concat" and c.activation == "silu"
    else:
        s = c.rope_scaling
        assert (s.rope_type, s.factor, s.original_max_position_embeddings, s.beta_fast,
                s.beta_slow) == ("yarn", 32.0, 4096, 32.0, 1.0)
        assert c.sliding_window == 128
        assert c.layer_types == ("sliding", "full") * (c.num_layers // 2)
        assert c.routing == "topk_softmax" and c.activation == "swiglu_oai"
        assert c.gate_up_layout == "interleaved" and c.has_sinks and c.attention_bias
        assert c.quantization == "mxfp4" and c.eos_token_ids == (200002,)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mixtral", "tiny-gpt-oss"])
def test_tiny_configs(name):
    c = ModelConfig.preset(name)
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.vocab_size) == (2, 64, 4, 2, 16, 256)
    assert c.hidden_size % 32 == 0 and c.intermediate_size % 32 == 0
    assert c.torch_dtype == "float32"
    if c.is_moe:
        assert (c.num_experts, c.top_k) == (4, 2)


def test_preset_unknown_lists_presets():
    with pytest.raises(ValueError) as e:
        ModelConfig.preset("llama-9")
    for name in PRESETS:
        assert name in str(e.value)


def test_preset_json_is_a_copy():
    d = preset_json("tiny-llama")
    d["hidden_size"] = 1
    assert ModelConfig.preset("tiny-llama").hidden_size == 64


def test_frozen_and_comparable():
    c = ModelConfig.preset("tiny-gpt-oss")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.hidden_size = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rope_scaling.factor = 2.0
    assert c == ModelConfig.preset("tiny-gpt-oss")
    hash(c)


# ---- from_json / from_pretrained -------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PRESETS))
def test_from_pretrained_round_trip(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(preset_json(name)))
    assert ModelConfig.from_pretrained(tmp_path) == ModelConfig.preset(name)
    assert ModelConfig.from_json(tmp_path / "config.json") == ModelConfig.preset(name)
    assert ModelConfig.from_json(str(tmp_path / "config.json")) == ModelConfig.preset(name)


def test_unknown_architecture_lists_supported(tmp_path):
    d = preset_json("tiny-llama")
    d["architectures"] = ["Qwen2ForCausalLM"]
    with pytest.raises(ValueError) as e:
        ModelConfig.from_json(d)
    for arch in SUPPORTED_ARCHITECTURES:
        assert arch in str(e.value)
    assert "Qwen2ForCausalLM" in str(e.value)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size",
                                 "architectures", "num_local_experts"])
def test_missing_key_names_key_and_file(tmp_path, key):
    d = preset_json("tiny-mixtral")
    del d[key]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(KeyError) as e:
        ModelConfig.from_json(path)
    assert key in str(e.value) and str(path) in str(e.value)


def test_missing_rope_scaling_key(tmp_path):
    d = preset_json("tiny-llama")
    del d["rope_scaling"]["low_freq_factor"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(KeyError, match="low_freq_factor") as e:
        ModelConfig.from_json(path)
    assert str(path) in str(e.value)


def test_gpt_oss_details():
    d = preset_json("tiny-gpt-oss")
    del d["experts_per_token"]  # num_experts_per_tok is accepted too
    d["layer_types"] = ["full_attention", "sliding_attention"]
    d["eos_token_id"] = [5, 7]
    c = ModelConfig.from_json(d)
    assert c.top_k == 2 and c.layer_types == ("full", "sliding") and c.eos_token_ids == (5, 7)
    del d["layer_types"]  # transformers' default: even layers slide
    assert ModelConfig.from_json(d).layer_types == ("sliding", "full")
    d["layer_types"] = ["full_attention"] * 2
    c = ModelConfig.from_json(d)
    assert c.layer_types == ("full", "full") and c.sliding_window is None


@pytest.mark.parametrize("change, match", [
    ({"swiglu_limit": 8.0}, "swiglu_limit"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"layer_types": ["local", "full_attention"]}, "layer_types"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"experts_per_token": 9}, "experts per token"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "linear"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_refused_gpt_oss(change, match):
    d = preset_json("tiny-gpt-oss")
    d.update(change)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_json(d)


@pytest.mark.parametrize("change, match", [
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                       "original_max_position_embeddings": 64}}, "yarn"),
])
def test_refused_llama(change, match):
    d = preset_json("tiny-llama")
    d.update(change)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_json(d)


def test_defaults_and_mixtral_window():
    d = preset_json("tiny-llama")
    for key in ("num_key_value_heads", "head_dim", "rms_norm_eps", "rope_scaling",
                "eos_token_id", "torch_dtype"):
        del d[key]
    c = ModelConfig.from_json(d)
    assert (c.num_kv_heads, c.head_dim, c.rms_norm_eps, c.rope_scaling, c.eos_token_ids,
            c.torch_dtype) == (4, 16, 1e-6, None, (), "float32")
    m = preset_json("tiny-mixtral")
    m["sliding_window"] = 32
    c = ModelConfig.from_json(m)
    assert c.layer_types == ("sliding", "sliding") and c.sliding_window == 32


def test_from_json_bad_input(tmp_path):
    with pytest.raises(TypeError, match="path_or_dict"):
        ModelConfig.from_json(3)
    with pytest.raises(FileNotFoundError):
        ModelConfig.from_json(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        ModelConfig.from_pretrained(tmp_path)


# ---- RoPE ------------------------------------------------------------------------------------
# The references below are written independently of gnomon's code: per dimension, in float64
# Python math, from the formulas of Llama 3.1's reference code and the YaRN paper.

def ref_plain(dim, base):
    return [base ** (-(2 * j) / dim) for j in range(dim // 2)]


def ref_llama3(dim, base, factor, low, high, orig):
    out = []
    for f in ref_plain(dim, base):
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def ref_yarn(dim, base, factor, orig, beta_fast, beta_slow, truncate=True):
    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = corr(beta_fast), corr(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    out = []
    for j, f in enumerate(ref_plain(dim, base)):
        ramp = min(max((j - lo) / (hi - lo), 0.0), 1.0)  # 0: keep (extrapolate), 1: interpolate
        out.append(f * (1 - ramp) + (f / factor) * ramp)
    mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return out, mscale


def ref_cache(inv_freq, scale, max_pos):
    pos = torch.arange(max_pos, dtype=torch.float64)[:, None]
    ang = pos * torch.tensor(inv_freq, dtype=torch.float64)[None, :]
    return torch.cat([ang.cos(), ang.sin()], 1) * scale


def with_scaling(name, **scaling):
    d = preset_json(name)
    d["rope_scaling"].update(scaling)
    return ModelConfig.from_json(d)


def test_plain_rope():
    c = ModelConfig.preset("tiny-mixtral")
    assert c.rope_scaling is None
    cache = cos_sin_cache(c, 200)
    assert cache.dtype == torch.float32 and cache.shape == (200, 16) and cache.is_contiguous()
    torch.testing.assert_close(cache.double(), ref_cache(ref_plain(16, 1e6), 1.0, 200),
                               atol=2e-5, rtol=0)


@pytest.mark.parametrize("factor, low, high, orig", [(8.0, 1.0, 4.0, 64), (4.0, 2.0, 3.0, 100),
                                                     (8.0, 1.0, 4.0, 8192)])
def test_llama3_against_reference(factor, low, high, orig):
    c = with_scaling("tiny-llama", factor=factor, low_freq_factor=low, high_freq_factor=high,
                     original_max_position_embeddings=orig)
    ref = ref_llama3(16, 10000.0, factor, low, high, orig)
    inv, scale = rope_inv_freq(c)
    assert scale == 1.0
    torch.testing.assert_close(inv.double(), torch.tensor(ref, dtype=torch.float64),
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(cos_sin_cache(c, 300).double(), ref_cache(ref, 1.0, 300),
                               atol=5e-5, rtol=0)


def test_llama3_properties():
    c = ModelConfig.preset("tiny-llama")  # orig 64, low 1, high 4, factor 8, dim 16, base 1e4
    inv, _ = rope_inv_freq(c)
    plain = torch.tensor(ref_plain(16, 1e4), dtype=torch.float32)
    wavelen = 2 * math.pi / plain
    low_band, high_band = wavelen > 64, wavelen < 16
    assert low_band.any() and high_band.any() and (~low_band & ~high_band).any()
    torch.testing.assert_close(inv[low_band], plain[low_band] / 8, rtol=1e-6, atol=0)
    torch.testing.assert_close(inv[high_band], plain[high_band], rtol=1e-6, atol=0)
    mid = ~low_band & ~high_band
    assert ((inv[mid] < plain[mid]) & (inv[mid] > plain[mid] / 8)).all()
    c1 = with_scaling("tiny-llama", factor=1.0)  # factor 1 scales nothing
    torch.testing.assert_close(rope_inv_freq(c1)[0], plain, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name, scaling", [
    ("tiny-gpt-oss", {}),
    ("tiny-gpt-oss", {"truncate": True, "factor": 8.0, "original_max_position_embeddings": 64}),
    ("gpt-oss-20b", {}),
])
def test_yarn_against_reference(name, scaling):
    c = with_scaling(name, **scaling)
    s = c.rope_scaling
    ref, mscale = ref_yarn(c.head_dim, c.rope_theta, s.factor,
                           s.original_max_position_embeddings, s.beta_fast, s.beta_slow,
                           s.truncate)
    inv, scale = rope_inv_freq(c)
    assert scale == pytest.approx(mscale, rel=1e-12)
    torch.testing.assert_close(inv.double(), torch.tensor(ref, dtype=torch.float64),
                               rtol=2e-6, atol=0)
    torch.testing.assert_close(cos_sin_cache(c, 256).double(), ref_cache(ref, mscale, 256),
                               atol=1e-4, rtol=0)


def test_yarn_properties():
    c = ModelConfig.preset("gpt-oss-20b")
    cache = cos_sin_cache(c, 64)
    a = 0.1 * math.log(32) + 1
    half = c.head_dim // 2
    torch.testing.assert_close(cache[0, :half], torch.full((half,), a))  # cos(0) * a
    torch.testing.assert_close(cache[0, half:], torch.zeros(half))
    norm = cache[:, :half] ** 2 + cache[:, half:] ** 2
    torch.testing.assert_close(norm, torch.full_like(norm, a * a))
    # dims rotating more than beta_fast times in the original context are untouched,
    # those rotating fewer than beta_slow times are divided by the factor
    inv, _ = rope_inv_freq(c)
    plain = torch.tensor(ref_plain(64, 150000.0), dtype=torch.float32)
    rotations = 4096 * plain / (2 * math.pi)
    fast, slow = rotations > 32, rotations < 1
    assert fast.sum() >= 8 and slow.sum() >= 8
    torch.testing.assert_close(inv[fast], plain[fast], rtol=1e-6, atol=0)
    torch.testing.assert_close(inv[slow], plain[slow] / 32, rtol=1e-6, atol=0)
    # factor 1: plain RoPE, no attention scaling
    c1 = with_scaling("gpt-oss-20b", factor=1.0)
    inv1, scale1 = rope_inv_freq(c1)
    assert scale1 == 1.0
    torch.testing.assert_close(inv1, plain, rtol=1e-6, atol=0)


def test_yarn_attention_factor_override():
    c = with_scaling("tiny-gpt-oss", attention_factor=1.5)
    assert rope_inv_freq(c)[1] == 1.5
    assert cos_sin_cache(c, 1)[0, 0].item() == 1.5


def test_cos_sin_cache_args():
    c = ModelConfig.preset("tiny-llama")
    with pytest.raises(ValueError, match="max_position"):
        cos_sin_cache(c, 0)
    assert cos_sin_cache(c, 4, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_cache_drives_rotary_embedding():
    """The table works with gnomon.ops.rotary_embedding (neox style) and rotates like
    x * cos + rotate_half(x) * sin, the transformers formula."""
    ops = pytest.importorskip("gnomon.ops")
    c = ModelConfig.preset("tiny-gpt-oss")
    cache = cos_sin_cache(c, 32)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, c.num_heads, c.head_dim, generator=g)
    k = torch.randn(5, c.num_kv_heads, c.head_dim, generator=g)
    pos = torch.tensor([0, 3, 7, 30, 31], dtype=torch.int64)
    half = c.head_dim // 2
    cos = torch.cat([cache[pos, :half]] * 2, 1)[:, None, :]
    sin = torch.cat([cache[pos, half:]] * 2, 1)[:, None, :]

    def rot(x):
        return torch.cat([-x[..., half:], x[..., :half]], -1)
    want_q, want_k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    ops.rotary_embedding(pos, q, k, cache, is_neox=True)
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)


def test_from_model(tmp_path):
    assert ModelConfig.from_model("tiny-mixtral") == ModelConfig.preset("tiny-mixtral")
    (tmp_path / "config.json").write_text(json.dumps(preset_json("tiny-llama")))
    assert ModelConfig.from_model(tmp_path) == ModelConfig.preset("tiny-llama")
    assert ModelConfig.from_model(str(tmp_path)) == ModelConfig.preset("tiny-llama")
    with pytest.raises(ValueError, match="gpt-oss-20b"):
        ModelConfig.from_model(str(tmp_path / "missing"))
