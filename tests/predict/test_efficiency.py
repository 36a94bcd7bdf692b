"""Kernel-efficiency curves and engine overhead: every point has a source, curves interpolate
in log x and hold their ends, borrowed generations say so, and the roofline applies them."""

import json
import math

import pytest

from gnomon import hardware
from gnomon.predict import efficiency
from gnomon.predict.cost import PredictionRefused
from gnomon.predict.engines import EngineOverhead, profiles, resolve_engine
from gnomon.predict.opcount import step_ops
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.shapes import ModelSpec, StepShape


def test_every_curve_and_figure_names_its_source():
    data = efficiency._data()
    for generation in data["generations"]:
        for name, curve in efficiency._generation(generation).items():
            assert curve.source and len(curve.xs) >= 1, (generation, name)
            if curve.default:
                assert "stated default" in curve.source
    for gpu, figures in data["best_gemm"].items():
        hardware.gpu(gpu)  # names a catalogued GPU
        for value, source in figures.values():
            assert 0 < value <= 1 and source
    for entry in data["defaults"].values():
        assert entry["source"]


def test_curve_is_linear_in_log_x_and_holds_its_ends():
    curve = efficiency.Curve.from_entry("t", {"points": [[100, 0.2], [400, 0.6]],
                                              "source": "test"}, "here")
    assert curve(10) == 0.2 and curve(100) == 0.2 and curve(1e6) == 0.6
    assert curve(200) == pytest.approx(0.4)  # halfway in log2
    assert curve(0) == 0.2
    with pytest.raises(ValueError, match="names its source"):
        efficiency.Curve.from_entry("t", {"points": [[1, 0.5]]}, "here")
    with pytest.raises(ValueError, match=r"factor in \(0, 1\]"):
        efficiency.Curve.from_entry("t", {"points": [[1, 1.5]], "source": "s"}, "here")


def test_generations_without_curves_borrow_and_say_so():
    a100 = efficiency.curves_for(hardware.gpu("A100"))
    assert a100.generation == "hopper" and "A100" in a100.note and "nearest" in a100.note
    assert efficiency.curves_for(hardware.gpu("H100")).note is None
    assert efficiency.curves_for(hardware.gpu("MI250X")).generation == "cdna3"
    host_like = hardware.Hardware("unit", "test", *(hardware.Figure(1.0, "t"),) * 5)
    assert efficiency.curves_for(host_like) is None


def test_small_k_and_few_tokens_per_expert_cost_more_per_flop():
    h100 = RooflinePredictor("H100")
    curves = h100.efficiencies.curves
    assert curves["gemm_k"](512) < curves["gemm_k"](2048) < curves["gemm_k"](16384) == 1.0
    assert curves["grouped_gemm"](256) < curves["grouped_gemm"](4096)
    spec = ModelSpec.from_model("gpt-oss-120b")
    ops = {op.name: op for op in step_ops(StepShape.of(spec, [(8192, 0)]))}
    w13, w2 = ops["fused_moe[w13]"], ops["fused_moe[w2]"]
    assert w13.rows == w2.rows == round(8192 * 4 / 128)  # all 128 experts run
    assert (w13.depth, w2.depth) == (2880, 2880) and w13.flops == 2 * w2.flops


def test_mxfp4_experts_run_w4a16_on_hopper_and_mxfp8_activations_on_blackwell(tmp_path):
    spec = ModelSpec.from_model("gpt-oss-120b")
    h100, b200 = RooflinePredictor("H100"), RooflinePredictor("B200")
    op = next(o for o in step_ops(StepShape.of(spec, [(16384, 0)])) if o.name == "fused_moe[w13]")
    assert op.compute == "w4a8"

    def rate(p):
        return op.flops / (p.op_seconds(op) - op.launches * p.efficiencies.launch_s)

    c = h100.efficiencies.curves
    assert rate(h100) == pytest.approx(  # weight-only at the bf16 peak
        989e12 * h100.efficiencies.compute["bfloat16"] * c["grouped_gemm"](op.rows)
        * c["gemm_k"](op.depth) * c["w4a16"](op.rows), rel=1e-9)
    c = b200.efficiencies.curves
    assert rate(b200) == pytest.approx(  # the FP8 peak: MXFP8 activations, not FP4 x FP4
        hardware.gpu("B200").fp8_tflops.value * 1e12 * b200.efficiencies.compute["fp8"]
        * c["grouped_gemm"](op.rows) * c["gemm_k"](op.depth), rel=1e-9)
    # dense NVFP4 weights (W4A4 checkpoints) keep the FP4 peak
    nvfp4 = ModelSpec.from_model("llama-3.1-70b", weight_dtype="nvfp4")
    assert nvfp4.linear_compute == "fp4" and nvfp4.expert_compute == "fp4"
    # a chip whose FP4 figure is unknown cannot tell: refused, naming the field
    base = {"name": "Mystery", "vendor": "NVIDIA", "generation": "blackwell",
            "bf16_tflops": 2000, "fp8_tflops": 4000, "hbm_tbps": 8, "hbm_gb": 180}
    (tmp_path / "m.json").write_text(json.dumps(base))
    with pytest.raises(PredictionRefused, match="fp4_tflops is not given"):
        RooflinePredictor(str(tmp_path / "m.json")).op_seconds(op)


def test_attention_prefill_efficiency_grows_with_context():
    spec = ModelSpec.from_model("llama-3.1-8b")
    p = RooflinePredictor("H100")
    short = p.predict(StepShape.of(spec, [(512, 0)])).breakdown["attention"]
    long = p.predict(StepShape.of(spec, [(512, 15872)])).breakdown["attention"]
    # 32x the keys per query costs less than 32x: FA3 runs faster at long context
    assert long < 32 * short * 0.75


def test_overhead_is_its_own_family_and_overlap_hides_it():
    spec = ModelSpec.from_model("llama-3.1-8b")
    shape = StepShape.of(spec, [(1, 500)] * 10)
    bare = RooflinePredictor("H100").predict(shape)
    serial = RooflinePredictor("H100", overhead=EngineOverhead(1e-3, 1e-4)).predict(shape)
    assert bare.breakdown["overhead"] == 0
    assert serial.breakdown["overhead"] == pytest.approx(1e-3 + 10 * 1e-4)
    assert serial.seconds == pytest.approx(bare.seconds + 2e-3)
    hidden = RooflinePredictor("H100", overhead=EngineOverhead(1e-3, 0, overlapped=True))
    assert hidden.predict(shape).breakdown["overhead"] == 0  # the GPU step is longer
    big = RooflinePredictor("H100", overhead=EngineOverhead(1.0, 0, overlapped=True))
    assert big.predict(shape).seconds == pytest.approx(1.0)
    with pytest.raises(ValueError, match="per_step_s"):
        EngineOverhead(-1.0)


def test_exposed_overhead_is_paid_per_sequence_whatever_the_overlap():
    spec = ModelSpec.from_model("llama-3.1-8b")
    shape = StepShape.of(spec, [(1, 500)] * 10)
    bare = RooflinePredictor("H100").predict(shape)
    hidden = EngineOverhead(1e-3, 1e-5, overlapped=True)  # less than the GPU's step: hidden
    exposed = EngineOverhead(1e-3, 1e-5, overlapped=True, exposed_per_seq_s=3e-5)
    assert RooflinePredictor("H100", overhead=hidden).predict(shape).breakdown["overhead"] == 0
    cost = RooflinePredictor("H100", overhead=exposed).predict(shape)
    assert cost.breakdown["overhead"] == pytest.approx(10 * 3e-5)
    assert cost.seconds == pytest.approx(bare.seconds + 10 * 3e-5)
    serial = EngineOverhead(1e-3, 0, exposed_per_seq_s=2e-5)  # not overlapped: both add
    assert serial.seconds(10, 1.0) == pytest.approx(1e-3 + 10 * 2e-5)
    with pytest.raises(ValueError, match="exposed_per_seq_s"):
        EngineOverhead(exposed_per_seq_s=-1e-6)
    with pytest.raises(ValueError, match="exposed_per_seq_s"):
        EngineOverhead(exposed_per_seq_s=float("nan"))


def test_a_simulation_states_the_exposed_overhead_it_adds():
    from gnomon.predict.simulate import simulate
    from gnomon.predict.spec import SimulationSpec
    from gnomon.predict.workloads import parse_length

    vllm = profiles()["vllm"]
    report, _ = simulate(SimulationSpec.of(
        model="llama-3.1-8b", hardware="H100 SXM", engine="vllm", num_requests=4, concurrency=4,
        input_len=parse_length("64", "i"), output_len=parse_length("8", "o")))
    line = [x for x in report["limits"] if "per running sequence that no overlap hides" in x]
    assert len(line) == 1
    assert f"{vllm.overhead.exposed_per_seq_s * 1e6:g} us" in line[0]
    assert vllm.sources["exposed_overhead"] in line[0]


def test_engine_profiles_and_files(tmp_path):
    for name, p in profiles().items():
        assert p.sources["overhead"] and p.sources["scheduler"], name
        if p.overhead.exposed_per_seq_s:  # a fitted figure names the rows it was fitted on
            assert "bench/fit_overhead.py" in p.sources["exposed_overhead"], name
    raw = json.loads(open(resolve_engine.__globals__["DATA_FILE"]).read())["engines"]["vllm"]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**raw, "name": "mine",
                                "overhead": {**raw["overhead"], "per_step_s": 0.002}}))
    mine = resolve_engine(str(path))
    assert mine.name == "mine" and mine.overhead.per_step_s == 0.002
    del raw["max_num_seqs"]
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="lacks the field 'max_num_seqs'"):
        resolve_engine(str(path))
    with pytest.raises(ValueError, match="unknown 'tgi'"):
        resolve_engine("tgi")
    with pytest.raises(FileNotFoundError, match="gone.json"):
        resolve_engine(str(tmp_path / "gone.json"))


def test_every_catalogued_gpu_prices_every_preset_model():
    for gpu in hardware.GPUS:
        p = RooflinePredictor(gpu)
        for model in ("llama-3.1-8b", "gpt-oss-120b"):
            cost = p.predict(StepShape.of(ModelSpec.from_model(model), [(256, 0), (1, 300)]))
            assert math.isfinite(cost.seconds) and cost.seconds > 0, (gpu.name, model)


def test_every_measured_allreduce_names_its_source_and_grows_with_its_payload():
    tables = {k: v for k, v in efficiency._data()["allreduce"].items() if k != "about"}
    assert {"H100 SXM", "H200", "B200"} <= set(tables)
    for gpu, entry in tables.items():
        hw = hardware.gpu(gpu)  # names a catalogued GPU
        if "as" in entry:
            assert entry["source"] and entry["as"] in tables
            continue
        for engine in entry:
            table = efficiency.allreduce_table(hw, engine)
            assert "aiconfigurator" in table.source, (gpu, engine)
            for ranks, points in table.gpus.items():
                times = [s for _, s in points]
                assert ranks in (2, 4, 8) and times == sorted(times), (gpu, engine, ranks)


def test_allreduce_table_is_log_log_between_points_and_holds_its_floor():
    table = efficiency.AllReduceTable(
        "e", {2: ((math.log2(1e3), math.log2(4e-6)), (math.log2(1e5), math.log2(16e-6)))}, "t")
    assert table.seconds(2, 10.0) == pytest.approx(4e-6)  # below the first: the floor
    assert table.seconds(2, 1e4) == pytest.approx(8e-6)  # halfway in log-log
    assert table.seconds(2, 4e5) == pytest.approx(64e-6)  # beyond the last: at its rate
    assert table.seconds(4, 1e4) is None  # 4 GPUs not measured
    h100, h200 = hardware.gpu("H100"), hardware.gpu("H200")
    assert efficiency.allreduce_table(h100, None) is None
    assert efficiency.allreduce_table(h100, "tgi") is None
    assert efficiency.allreduce_table(h200, "vllm").gpus == \
        efficiency.allreduce_table(h100, "vllm").gpus
    assert "as H100 SXM" in efficiency.allreduce_table(h200, "vllm").source


def test_roofline_prices_an_engines_allreduce_as_measured_and_others_by_the_ring():
    from gnomon.costing import Op, ring_bytes

    hidden = 64 * 8192 * 2  # 64 tokens' bf16 hidden states
    op = Op("communication", "all_reduce", 0.0, 0.0, 160,
            comm_bytes=160 * ring_bytes("all_reduce", hidden, 8), collectives=160, ranks=8)
    ring = RooflinePredictor("H100")
    measured = RooflinePredictor("H100", kernels="trtllm")
    table = efficiency.allreduce_table(hardware.gpu("H100"), "trtllm")
    assert measured.op_seconds(op) == pytest.approx(160 * table.seconds(8, hidden))
    assert ring.op_seconds(op) == pytest.approx(
        160 * (ring_bytes("all_reduce", hidden, 8) / 450e9 + 10e-6))
    # a GPU count the engine's table lacks, and the other collectives, keep the ring model
    wide = op._replace(ranks=16)
    assert measured.op_seconds(wide) == pytest.approx(ring.op_seconds(wide))
    gather = Op("communication", "all_gather", 0.0, 0.0, 1, comm_bytes=1e6, collectives=1,
                ranks=8)
    assert measured.op_seconds(gather) == ring.op_seconds(gather)
    assert resolve_engine("vllm-0.10").kernels == "vllm"
    assert resolve_engine("gnomon").kernels is None
    with pytest.raises(TypeError, match="kernels: expected"):
        RooflinePredictor("H100", kernels=8)


def test_an_engine_file_names_its_measured_kernels_or_is_refused(tmp_path):
    raw = json.loads(open(resolve_engine.__globals__["DATA_FILE"]).read())["engines"]["vllm"]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**raw, "name": "mine", "kernels": 3}))
    with pytest.raises(ValueError, match="kernels: expected the name"):
        resolve_engine(str(path))
    path.write_text(json.dumps({**raw, "name": "mine", "kernels": None}))
    assert resolve_engine(str(path)).kernels is None


def test_giving_the_ring_models_figures_prices_the_allreduce_with_them():
    from gnomon.costing import Op, ring_bytes

    op = Op("communication", "all_reduce", 0.0, 0.0, 1,
            comm_bytes=ring_bytes("all_reduce", 1e6, 8), collectives=1, ranks=8)
    given = RooflinePredictor("H100", {"allreduce_latency_s": 0.0}, kernels="vllm")
    assert given.efficiencies.allreduce is None
    assert given.op_seconds(op) == pytest.approx(ring_bytes("all_reduce", 1e6, 8) / 450e9)
    assert RooflinePredictor("H100", {"memory": 0.7}, kernels="vllm").efficiencies.allreduce


@pytest.mark.parametrize("kind", efficiency.FITTED_KINDS)
def test_every_fitted_kernel_names_its_fit_and_stays_within_the_peak(kind):
    tables = {k: v for k, v in efficiency._data()[kind].items() if k != "about"}
    assert {"H100 SXM", "H200", "B200"} <= set(tables)
    maths = {"moe": ("bfloat16", "fp8", "fp4", "w4a16", "w4a16_fp4", "w4a8"),
             "decode_attention": ("bfloat16", "fp8")}[kind]
    for gpu, entry in tables.items():
        hw = hardware.gpu(gpu)
        if "as" in entry:
            assert entry["source"] and entry["as"] in tables
            continue
        for engine, raw in entry.items():
            kernel = efficiency.fitted_kernel(kind, hw, engine)
            assert "aiconfigurator" in kernel.source and kernel.kind == kind, (gpu, engine)
            for name, (floor, memory, compute) in kernel.maths.items():
                fit = raw["maths"][name]
                assert name in maths, (gpu, engine, name)
                assert 0 <= floor < 1e-4 and 0 < memory <= 1, (gpu, engine, name)
                # the MoE's fits count its FLOPs too where the table's heavy rows allow;
                # attention's never do
                assert compute == fit.get("compute", 0) and 0 <= compute <= 1
                assert kind == "moe" or compute == 0, (gpu, engine, name)
                if compute:
                    assert fit["compute_rows"] > 0 and fit["compute_median_error"] <= 0.25
                assert fit["rows"] > 0 and fit["median_error"] <= 0.25
                assert "perf" in fit["table"]


def test_a_fitted_kernel_comes_through_the_gpus_alias_and_a_bad_entry_names_itself(monkeypatch):
    h100, h200 = hardware.gpu("H100"), hardware.gpu("H200")
    assert efficiency.fitted_kernel("moe", h100, None) is None
    assert efficiency.fitted_kernel("moe", h100, "tgi") is None
    assert efficiency.fitted_kernel("moe", h200, "vllm").maths == \
        efficiency.fitted_kernel("moe", h100, "vllm").maths
    assert "as H100 SXM" in efficiency.fitted_kernel("decode_attention", h200, "vllm").source
    with pytest.raises(ValueError, match="kind: expected one of moe, decode_attention"):
        efficiency.fitted_kernel("gemm", h100, "vllm")
    data = json.loads(json.dumps(efficiency._data()))
    data["moe"]["H100 SXM"]["vllm"]["maths"]["w4a16"]["memory"] = 1.5
    monkeypatch.setattr(efficiency, "_data", lambda: data)
    efficiency._fitted_kernel.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"moe\.H100 SXM\.vllm: maths\.w4a16: expected"):
            efficiency.fitted_kernel("moe", h100, "vllm")
    finally:
        efficiency._fitted_kernel.cache_clear()


def test_roofline_prices_the_engines_fused_moe_as_measured_in_the_math_the_experts_run_in():
    """gpt-oss's MXFP4 experts run weight-only on H100 (no FP4 math: the engine's kernel for
    FP4-coded weights, w4a16_fp4) and w4a8 on B200: each grouped GEMM streams its weights at the
    fit's fraction of the HBM peak, runs its FLOPs at the fit's fraction of the dense peak of
    that math (bf16 for w4a16_fp4, FP8 for w4a8) and adds half its floor per layer, at a
    decode's four tokens and a prefill's 8,192 alike; without the engine, the curves and the
    launch cost."""
    spec = ModelSpec.from_model("gpt-oss-120b")
    layers = spec.config.num_layers
    for requests in ([(1, 500)] * 4, [(8192, 0)]):
        ops = {o.name: o for o in step_ops(StepShape.of(spec, requests))}
        w13, w2 = ops["fused_moe[w13]"], ops["fused_moe[w2]"]
        assert w13.launches == w2.launches == layers
        for gpu, math_, peak in (("H100", "w4a16_fp4", "bfloat16"), ("B200", "w4a8", "fp8")):
            hw = hardware.gpu(gpu)
            floor, memory, compute = efficiency.fitted_kernel("moe", hw, "vllm").maths[math_]
            p = RooflinePredictor(gpu, kernels="vllm")
            for op in (w13, w2):
                assert p.op_seconds(op) == pytest.approx(
                    op.bytes / (hw.hbm_tbps.value * 1e12 * memory)
                    + op.flops / (hw.tflops(peak) * 1e12 * compute) + layers * floor / 2,
                    rel=1e-9)
        if len(requests) == 4:  # memory bound: no engine, the grouped-GEMM memory curve
            plain = RooflinePredictor("H100")
            fraction = plain.efficiencies.curves["grouped_gemm_memory"](w13.rows)
            assert plain.op_seconds(w13) == pytest.approx(
                w13.bytes / (hardware.gpu("H100").hbm_tbps.value * 1e12 * fraction)
                + layers * 4e-6, rel=1e-9)
    # rejected by bench/kernel_tables.py: L40S's tables fit with a negative floor
    assert efficiency.fitted_kernel("moe", hardware.gpu("L40S"), "vllm") is None
    dense = next(o for o in step_ops(StepShape.of(ModelSpec.from_model("llama-3.1-8b"),
                                                  [(1, 500)])) if o.family == "gemm")
    assert RooflinePredictor("H100", kernels="vllm").op_seconds(dense) == \
        RooflinePredictor("H100").op_seconds(dense)  # dense GEMMs are not the MoE's


def test_int4_and_fp4_experts_run_weight_only_each_at_its_own_measured_kernel():
    """Kimi-K2.5's INT4 experts and gpt-oss's MXFP4 ones both run weight-only on H100, on two
    kernels: the INT4 one is fitted on the table's int4_wo rows alone ("w4a16") and the FP4 one
    on its w4a16_mxfp4 rows ("w4a16_fp4"), and each op is priced with its own. On B200 the INT4
    experts keep theirs (the chip's FP4 math does not run INT4 weights)."""
    kimi = ModelSpec.from_model("kimi-k2.5")
    gpt = ModelSpec.from_model("gpt-oss-120b")
    for gpu, spec, math_, table in (("H100", kimi, "w4a16", "(int4_wo)"),
                                    ("H100", gpt, "w4a16_fp4", "(w4a16_mxfp4)"),
                                    ("B200", kimi, "w4a16", "(int4_wo)")):
        hw = hardware.gpu(gpu)
        floor, memory, compute = efficiency.fitted_kernel("moe", hw, "vllm").maths[math_]
        raw = efficiency._data()["moe"]["H100 SXM" if gpu == "H100" else gpu]["vllm"]
        assert raw["maths"][math_]["table"].endswith(table)
        op = next(o for o in step_ops(StepShape.of(spec, [(8192, 0)], tp=8))
                  if o.name == "fused_moe[w13]")
        assert RooflinePredictor(gpu, kernels="vllm").op_seconds(op) == pytest.approx(
            op.bytes / (hw.hbm_tbps.value * 1e12 * memory)
            + op.flops / (hw.bf16_tflops.value * 1e12 * compute) + op.launches * floor / 2,
            rel=1e-9)
    h100 = efficiency.fitted_kernel("moe", hardware.gpu("H100"), "vllm").maths
    assert h100["w4a16"] != h100["w4a16_fp4"]


def test_a_measured_moe_without_a_compute_fit_runs_its_flops_at_the_grouped_gemm_curve():
    """B300's TensorRT-LLM NVFP4 MoE keeps its memory fit, and its compute fit is rejected
    (median error 28%): at a prefill's 8,192 tokens its FLOPs take the grouped-GEMM curve's
    time, as without the engine, and its bytes and floor the fit's."""
    b300 = hardware.gpu("B300")
    floor, memory, compute = efficiency.fitted_kernel("moe", b300, "trtllm").maths["fp4"]
    assert compute == 0
    spec = ModelSpec.from_model("deepseek-v3", weight_dtype="nvfp4")
    w13 = next(o for o in step_ops(StepShape.of(spec, [(8192, 0)], tp=8))
               if o.name == "fused_moe[w13]")
    measured, plain = RooflinePredictor("B300", kernels="trtllm"), RooflinePredictor("B300")
    hbm = b300.hbm_tbps.value * 1e12
    streamed = w13.bytes / (hbm * memory)
    plain_streamed = w13.bytes / (hbm * plain.efficiencies.curves["grouped_gemm_memory"](w13.rows))
    flops_time = plain.op_seconds(w13) - w13.launches * 4e-6
    assert flops_time > max(streamed, plain_streamed)  # compute bound either way
    assert measured.op_seconds(w13) == pytest.approx(flops_time + w13.launches * floor / 2,
                                                     rel=1e-9)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8"])
def test_roofline_prices_paged_attention_with_the_engines_decode_kernel_for_its_kv_dtype(kv_dtype):
    spec = ModelSpec.from_model("llama-3.1-70b", kv_dtype=kv_dtype)
    op = next(o for o in step_ops(StepShape.of(spec, [(1, 4000)] * 32, tp=4))
              if o.name == "paged_attention")
    assert op.kv_dtype == kv_dtype
    hw = hardware.gpu("H100")
    floor, memory, _ = efficiency.fitted_kernel("decode_attention", hw, "vllm").maths[kv_dtype]
    layers = spec.config.num_layers
    measured = RooflinePredictor("H100", kernels="vllm").op_seconds(op)
    assert measured == pytest.approx(
        op.bytes / (hw.hbm_tbps.value * 1e12 * memory) + layers * floor, rel=1e-9)
    plain = RooflinePredictor("H100")  # no engine: the stated-default decode curve
    fraction = plain.efficiencies.curves["attention_decode"](op.rows)
    assert plain.op_seconds(op) == pytest.approx(
        op.bytes / (hw.hbm_tbps.value * 1e12 * fraction) + layers * 4e-6, rel=1e-9)
    # a KV dtype the engine's table lacks keeps the curve
    f16 = next(o for o in step_ops(StepShape.of(ModelSpec.from_model(
        "llama-3.1-70b", kv_dtype="float16"), [(1, 4000)] * 32, tp=4))
        if o.name == "paged_attention")
    assert RooflinePredictor("H100", kernels="vllm").op_seconds(f16) == \
        pytest.approx(plain.op_seconds(f16), rel=1e-9)


def test_the_fits_are_what_bench_kernel_tables_computes_from_the_tables():
    """efficiency.json's ``moe`` and ``decode_attention`` sections are bench/kernel_tables.py's
    output on the installed aiconfigurator-core tables, entry for entry (where that package and
    pandas are here)."""
    pytest.importorskip("aiconfigurator_core")
    pytest.importorskip("pandas")
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "kernel_tables.py")
    spec = importlib.util.spec_from_file_location("kernel_tables", path)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    for kind in efficiency.FITTED_KINDS:
        data = efficiency._data()[kind]
        for system, gpu in tables.SYSTEMS.items():
            fitted = {engine: entry["maths"] for engine, entry
                      in tables.fitted(system, kind).items() if entry["maths"]}
            held = {engine: entry["maths"] for engine, entry in data.get(gpu, {}).items()}
            assert fitted == held, (kind, gpu)


def test_ops_the_measured_attention_call_performs_are_priced_with_it_not_again():
    """aiconfigurator times vLLM's attention backend forward (which writes the KV cache) and
    TensorRT-LLM's attention op (which also applies RoPE): where that kernel prices the step's
    attention, gnomon's reshape_and_cache (and for TensorRT-LLM rotary_embedding) add nothing;
    without an engine, or for a KV dtype it was not measured in, they are priced as before."""
    shape = StepShape.of(ModelSpec.from_model("llama-3.1-70b", weight_dtype="fp8",
                                              kv_dtype="fp8"), [(1, 3000)] * 16, tp=4)
    ops = step_ops(shape)
    for engine, free in (("vllm", {"reshape_and_cache"}),
                         ("trtllm", {"reshape_and_cache", "rotary_embedding"})):
        p = RooflinePredictor("H100", kernels=engine)
        assert set(p.efficiencies.attention.includes) == free
        expected = sum(p.op_seconds(op) for op in ops if op.name not in free)
        cost = p.predict(shape)
        assert cost.seconds - cost.breakdown.get("overhead", 0.0) == pytest.approx(expected,
                                                                                    rel=1e-9)
    plain = RooflinePredictor("H100")
    assert plain.predict(shape).seconds == pytest.approx(
        sum(plain.op_seconds(op) for op in ops), rel=1e-9)
    f16 = StepShape.of(ModelSpec.from_model("llama-3.1-70b", kv_dtype="float16"),
                       [(1, 3000)] * 16, tp=4)
    p = RooflinePredictor("H100", kernels="trtllm")
    assert p.predict(f16).seconds == pytest.approx(
        sum(p.op_seconds(op) for op in step_ops(f16)), rel=1e-9)
