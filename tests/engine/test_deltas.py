"""Block tables travel as deltas: the real runner rebuilds every table it is handed, step by
step, exactly as the allocator holds it; the simulated runner tracks which sequences it has seen;
both refuse a stale delta; and a step's delta work does not grow with the context."""

import pytest

from gnomon.engine.batch import ScheduledBatch, ScheduledSequence
from gnomon.engine.block_tables import BlockTables
from gnomon.engine.config import ModelConfig
from gnomon.engine.llm import LLMEngine
from gnomon.engine.sampling_params import SamplingParams
from gnomon.predict.roofline import RooflinePredictor
from gnomon.engine.engine_config import EngineConfig
from gnomon.predict.serve import simulated_engine
from gnomon.predict.shapes import ModelSpec

BLOCK = 16
SHARED = list(range(3, 35))  # two full blocks that later requests find in the prefix cache


class CheckingRunner:
    """Wraps a runner; after each step, every scheduled sequence's table as the real runner
    rebuilt it must equal the allocator's, and the simulated runner must know it."""

    def __init__(self, runner, engine_ref):
        self.runner, self.engine_ref, self.checked = runner, engine_ref, 0
        self.saw_delta = self.saw_replaced = False

    def execute(self, batch):
        out = self.runner.execute(batch)
        kv = self.engine_ref[0].kv
        for s in batch.sequences:
            if hasattr(self.runner, "tables"):
                for g in range(len(kv.windows)):
                    assert self.runner.tables.table(s.seq_id, g) == kv.block_table(s.seq_id, g), s
            else:
                assert s.seq_id in self.runner.known
            self.checked += 1
            self.saw_delta |= not s.full and any(s.block_ids)
            self.saw_replaced |= any(s.replaced_blocks)
        return out

    def execute_logits(self, batch):
        return self.runner.execute_logits(batch)


def _drive(engine, checker):
    now = [0.0]
    engine.clock = lambda: now[0]
    prompt37 = SHARED + list(range(40, 45))  # 37 tokens: a partial third block
    engine.add_request("n2", prompt37, SamplingParams(n=2, max_tokens=24, temperature=1.0,
                                                      seed=5, ignore_eos=True), arrival_time=0)
    for i in range(3):  # long enough to overflow the cache while n2 decodes: preemption
        engine.add_request(f"long{i}", SHARED + [50 + i] * 20,
                           SamplingParams(max_tokens=40, temperature=0, ignore_eos=True),
                           arrival_time=0.5 + i)
    while engine.has_unfinished_requests():
        if not engine.step():
            nxt = engine.next_arrival_time()
            now[0] = max(now[0] + 0.25, nxt if nxt is not None else now[0])
        now[0] += 0.25
    stats = engine.kv.stats()
    assert engine.scheduler.num_preemptions > 0, "the workload must preempt"
    assert stats["hits"] > 0, "the workload must hit the prefix cache"
    assert checker.checked > 100 and checker.saw_delta and checker.saw_replaced
    out = engine.get_output("n2")
    assert [len(c.token_ids) for c in out.outputs] == [24, 24]


@pytest.mark.parametrize("model, num_kv_blocks", [("tiny-llama", 12), ("tiny-gpt-oss", 20)])
def test_real_runner_rebuilds_every_table(model, num_kv_blocks):
    """tiny-gpt-oss has two KV-cache groups: every group's table is rebuilt, window releases
    (-1 in place) included."""
    ref = [None]
    engine = LLMEngine(model, random_weights=True, dtype="float32", max_model_len=128,
                       block_size=BLOCK, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=64,
                       max_num_seqs=8)
    checker = CheckingRunner(engine.runner, ref)
    engine.runner = checker
    ref[0] = engine
    _drive(engine, checker)


def test_simulated_runner_tracks_every_sequence():
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")
    engine = simulated_engine(spec, "H100", RooflinePredictor("H100"),
                              EngineConfig(block_size=BLOCK, max_model_len=128, num_kv_blocks=12,
                                           max_num_batched_tokens=64, max_num_seqs=8))
    checker = CheckingRunner(engine.runner, [engine])
    engine.runner = checker
    _drive(engine, checker)


def _seq(seq_id, full, block_ids=(), replaced=(), computed=0):
    return ScheduledSequence(seq_id, "r", 0, (1,), computed, (tuple(block_ids),), True,
                             SamplingParams(), full, (tuple(replaced),))


def test_a_delta_to_an_unseen_sequence_is_refused_by_name():
    tables = BlockTables(8)
    with pytest.raises(RuntimeError, match="sequence 3"):
        tables.apply(ScheduledBatch((_seq(3, False, (1,)),)))
    tables.apply(ScheduledBatch((_seq(3, True, (1, 2)),)))
    tables.apply(ScheduledBatch((_seq(3, False, (4,), ((0, 5),)),)))
    assert tables.table(3) == (5, 2, 4)
    with pytest.raises(RuntimeError, match="replaces entry 7"):
        tables.apply(ScheduledBatch((_seq(3, False, (), ((7, 1),)),)))
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        tables.apply(ScheduledBatch((_seq(3, False, (9,)),)))
    tables.apply(ScheduledBatch(finished_seq_ids=(3,)))
    assert 3 not in tables and len(tables) == 0
    with pytest.raises(RuntimeError, match="sequence 3"):  # finished: gone
        tables.apply(ScheduledBatch((_seq(3, False, (1,)),)))


def test_a_delta_of_unequal_group_tables_is_refused_by_name():
    tables = BlockTables(8, windows=(None, 4))
    full = ScheduledSequence(3, "r", 0, (1,), 0, ((1, 2), (3, 4)), True, SamplingParams())
    tables.apply(ScheduledBatch((full,)))
    for ids in (((), (5,)), ((5,), ()), ((5,),)):  # a group left out, or one group only
        with pytest.raises(RuntimeError, match="sequence 3 carries block ids"):
            tables.apply(ScheduledBatch((full._replace(full=False, block_ids=ids),)))
    assert tables.table(3, 0) == (1, 2) and tables.table(3, 1) == (3, 4)


def test_simulated_runner_refuses_a_stale_delta():
    spec = ModelSpec.from_config(ModelConfig.preset("tiny-llama"), name="tiny-llama")
    engine = simulated_engine(spec, "H100", RooflinePredictor("H100"),
                              EngineConfig(num_kv_blocks=64))
    with pytest.raises(RuntimeError, match="sequence 11"):
        engine.runner.execute(ScheduledBatch((_seq(11, False, (2,), computed=4),),
                                             num_decode_tokens=1))


class CountingRunner:
    """Counts the block ids (appended or replaced) the batches hand the runner."""

    def __init__(self, runner):
        self.runner, self.ids = runner, 0

    def execute(self, batch):
        self.ids += sum(len(ids) for s in batch.sequences for ids in s.block_ids + s.replaced_blocks)
        return self.runner.execute(batch)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt-oss"])
@pytest.mark.parametrize("engine_kind", ["real", "simulated"])
def test_delta_work_per_decode_step_is_independent_of_the_context(engine_kind, model):
    """Block ids handed to the runner per decode step, counted (no clock): the same for 8
    sequences at ~64 and at ~400 tokens of context; only admission carries whole tables (and,
    with a sliding group, the next step the blocks the prefill left behind the window, once).
    The real runner's own counter (`BlockTables.ids_applied`) agrees."""

    def ids_per_decode_step(prompt_len):
        args = dict(block_size=BLOCK, max_model_len=512, max_num_batched_tokens=4096)
        if engine_kind == "real":
            engine = LLMEngine(model, random_weights=True, dtype="float32",
                               num_kv_blocks=600, **args)
        else:
            spec = ModelSpec.from_config(ModelConfig.preset(model), name=model)
            engine = simulated_engine(spec, "H100", RooflinePredictor("H100"),
                                      EngineConfig(num_kv_blocks=600, **args))
        counter = engine.runner = CountingRunner(engine.runner)
        for i in range(8):
            engine.add_request(i, [(7 * i + j) % 200 + 3 for j in range(prompt_len)],
                               SamplingParams(max_tokens=4 * BLOCK, temperature=0,
                                              ignore_eos=True), arrival_time=0)
        engine.step()  # every prompt at once: whole tables
        engine.step()  # the first decode also reports the blocks the prefill left behind a window
        admitted = counter.ids
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        if engine_kind == "real":
            assert counter.runner.tables.ids_applied == counter.ids
        return (counter.ids - admitted) / steps, admitted

    short, short_admitted = ids_per_decode_step(64)
    long, long_admitted = ids_per_decode_step(400)
    assert long_admitted > 5 * short_admitted  # admission does scale with the prompt
    assert abs(long - short) <= 0.05 * short  # the decode steps do not
    # about one new block per sequence and group every BLOCK steps, and in a sliding group one
    # released (-1 in place) as often
    windows = ModelConfig.preset(model).kv_cache_groups().windows
    per_block = len(windows) + sum(w is not None for w in windows)
    assert short <= 8 * per_block / BLOCK + 0.1
