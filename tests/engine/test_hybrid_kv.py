"""The hybrid KV cache in the engine: the groups a config yields, what they cost in memory, how
many sequences they hold, and the arguments they refuse. Token parity with transformers is in
test_hf_parity.py."""

import pytest

from gnomon.engine.config import ModelConfig, preset_json
from gnomon.engine.kv_cache import KVCacheGroups, KVCacheManager, max_blocks_held
from gnomon.engine.llm import LLMEngine


def test_groups_follow_layer_types():
    oss = ModelConfig.preset("gpt-oss-120b")
    groups = oss.kv_cache_groups()
    assert groups.windows == (None, 128)
    assert groups.layers == (tuple(range(1, 36, 2)), tuple(range(0, 36, 2)))
    assert groups.layers_per_group == 18
    assert groups.slot_of(0) == (1, 0) and groups.slot_of(35) == (0, 17)
    assert oss.kv_cache_groups(False) == KVCacheGroups.full(36)
    for name in ("llama-3.1-8b", "mixtral-8x7b", "tiny-llama"):  # no sliding layer
        config = ModelConfig.preset(name)
        assert config.kv_cache_groups() == KVCacheGroups.full(config.num_layers)


def test_unequal_groups_are_refused_by_name():
    raw = preset_json("tiny-gpt-oss")
    raw.update(num_hidden_layers=3,
               layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    config = ModelConfig.from_json(raw)
    with pytest.raises(ValueError, match=r"layer_types: .*1 full, 2 window-8.*"
                                         r"enable_hybrid_kv=False"):
        config.kv_cache_groups()
    assert config.kv_cache_groups(False).windows == (None,)
    with pytest.raises(ValueError, match="layer_types"):
        LLMEngine(config, random_weights=True, num_kv_blocks=8)
    with pytest.raises(TypeError, match="enable_hybrid_kv"):
        config.kv_cache_groups("yes")
    # the engine's settings are checked by EngineConfig, which names the field
    with pytest.raises(ValueError, match="enable_hybrid_kv: expected true or false"):
        LLMEngine("tiny-gpt-oss", random_weights=True, enable_hybrid_kv="yes")


@pytest.mark.parametrize("windows, layers, match", [
    ((), (), "at least one"),
    ((None, 0), ((0,), (1,)), "window"),
    ((None, 4), ((0, 2), (1,)), "same number of layers"),
    ((None, 4), ((0,), (0,)), "exactly one group"),
    ((None,), ((0, 2),), "exactly one group"),
])
def test_bad_groups_are_refused(windows, layers, match):
    with pytest.raises(ValueError, match=match):
        KVCacheGroups(windows, layers)


def _concurrent_sequences(groups, *, kv_cache_bytes, context, config):
    """How many sequences of `context` tokens, each computed whole in steps of 2048 tokens,
    the allocator holds at once in `kv_cache_bytes`: counted by admitting them until one does
    not fit."""
    kv = KVCacheManager.from_budget(groups=groups, num_kv_heads=config.num_kv_heads,
                                    head_dim=config.head_dim, dtype_size=2, block_size=16,
                                    kv_cache_bytes=kv_cache_bytes, enable_prefix_caching=False)
    held = 0
    while True:
        seq_id, tokens = held, [held % 1000 + 1] * context
        if not kv.allocator.allocate(seq_id, tokens, 0):
            return held
        computed = 0
        while computed < context:
            step = min(2048, context - computed)
            if kv.allocate_running([seq_id], [], [0], [step]) == 0:
                kv.free(seq_id)
                return held
            computed += step
            kv.commit_running([seq_id], [computed])
        held += 1


def test_hybrid_kv_holds_twice_the_8k_sequences_of_full_kv():
    """gpt-oss-120b's shape (18 full and 18 sliding layers of 8 KV heads of 64, window 128) at a
    fixed 8 GiB: the sliding group keeps only its window, so each block costs half as much."""
    config = ModelConfig.preset("gpt-oss-120b")
    budget, context = 8 * 2**30, 8192
    counts = {hybrid: _concurrent_sequences(config.kv_cache_groups(hybrid),
                                            kv_cache_bytes=budget, context=context,
                                            config=config)
              for hybrid in (True, False)}
    assert counts[False] >= 10
    assert counts[True] >= 1.9 * counts[False], counts


@pytest.mark.parametrize("hybrid", [True, False])
def test_kv_tensors_fill_the_budget_once(hybrid):
    """At a fixed kv_cache_bytes the runner's K/V tensors together take the budget (less than
    one block's worth under it), with the hybrid cache or without: every group's layer j shares
    one tensor pair, so the pool is not allocated once per layer."""
    import torch

    budget = 3 * 2**20
    engine = LLMEngine("tiny-gpt-oss", random_weights=True, kv_cache_bytes=budget,
                       enable_hybrid_kv=hybrid)
    caches = engine.runner.kv_caches
    total = sum(t.numel() * t.element_size() for pair in caches for t in pair)
    config = engine.config
    per_block = engine.kv_groups.bytes_per_block(
        block_size=16, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        dtype_size=torch.empty((), dtype=engine.dtype).element_size())
    assert budget - per_block < total <= budget
    assert len(caches) == (1 if hybrid else 2)  # tiny-gpt-oss: one sliding, one full layer
    assert all(k.shape[0] == engine.num_kv_blocks for k, _ in caches)


def test_a_lone_long_sequence_is_admitted_by_its_hybrid_footprint():
    """A lone long sequence runs to its end in a pool of exactly its hybrid footprint (the full
    group's table, plus the sliding group's window and one step's tokens); a block fewer and it
    is refused at add, rather than admitted to livelock."""
    config = ModelConfig.preset("tiny-gpt-oss")
    windows = config.kv_cache_groups().windows
    total = 400
    need = max_blocks_held(windows, total, block_size=16, max_step_tokens=64)
    assert need == 25 + (-(-(8 + 64) // 16) + 1)  # the full table, the window and one step
    engine = LLMEngine(config, random_weights=True, num_kv_blocks=need, max_model_len=512,
                       max_num_batched_tokens=64, max_num_seqs=4)
    from gnomon.engine.sampling_params import SamplingParams

    engine.add_request("long", [t % 250 + 1 for t in range(300)], SamplingParams(max_tokens=100,
                                                                   ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_output("long").finished
    assert engine.num_free_blocks == engine.num_kv_blocks
    small = LLMEngine(config, random_weights=True, num_kv_blocks=need - 1, max_model_len=512,
                      max_num_batched_tokens=64, max_num_seqs=4)
    with pytest.raises(ValueError, match="can never run.*at once"):
        small.add_request("long", [1] * 300, SamplingParams(max_tokens=100))
