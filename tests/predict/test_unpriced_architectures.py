"""Architectures gnomon knows of and cannot price yet (GLM-5's sparse attention, Qwen3.5's linear
attention) are refused by name, with the reason, from a config.json and from a measured row."""

import json

import pytest

from gnomon.engine.config import ModelConfig
from gnomon.predict.measured import PointRefused, from_silicon


@pytest.mark.parametrize("architecture, reason", [
    ("GlmMoeDsaForCausalLM", "DeepSeek Sparse Attention, an indexer picking index_topk keys"),
    ("Qwen3_5MoeForConditionalGeneration", "linear attention in 3 of every 4 layers"),
])
def test_a_config_of_an_unpriced_architecture_is_refused_with_its_reason(tmp_path, architecture,
                                                                       reason):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": [architecture], "vocab_size": 1000, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}))
    with pytest.raises(ValueError, match=reason):
        ModelConfig.from_model(str(tmp_path))


@pytest.mark.parametrize("model_path, reason", [
    ("zhipuai/GLM-5", "GlmMoeDsaForCausalLM \\(GLM-5\\): Multi-head Latent Attention with "
                      "DeepSeek Sparse Attention"),
    ("Qwen/Qwen3.5-397B-A17B", "Qwen3_5MoeForConditionalGeneration \\(Qwen3.5\\)"),
])
def test_their_measured_rows_are_refused_by_name(model_path, reason):
    row = dict(id="r", silicon_data_source="source_file=runs.csv", model_path=model_path,
               system="b200_sxm", backend="sglang", mode="agg", gemm_quant_mode="fp8",
               isl="1024", osl="1024", batch_size="4", tp_size="8", silicon_ttft_ms="100",
               silicon_tpot_ms="20")
    with pytest.raises(PointRefused, match=f"model_path '{model_path}': {reason}"):
        from_silicon(row)
