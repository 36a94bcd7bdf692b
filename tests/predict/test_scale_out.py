"""Layouts wider than one scale-up domain: a collective over more GPUs than an HGX board's 8 runs
at the scale-out network's bandwidth per GPU (the catalogue's ``scale_out_gbps``), refused where
the hardware gives none; silicon rows whose fields count more GPUs than their board are refused
as inconsistent."""

import json

import pytest

from gnomon import hardware
from gnomon.costing import Op
from gnomon.predict.cost import PredictionRefused
from gnomon.predict.measured import PointRefused, from_silicon
from gnomon.predict.roofline import RooflinePredictor
from gnomon.predict.simulate import simulate
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.workloads import parse_length

MB = 1e6


def _seconds(hw, name, ranks, nbytes=64 * MB, collectives=1):
    op = Op("communication", name, 0.0, 0.0, collectives, comm_bytes=nbytes,
            collectives=collectives, ranks=ranks)
    predictor = RooflinePredictor(hw)
    return predictor.op_seconds(op), predictor.efficiencies.allreduce_latency_s


def test_a_ring_within_the_board_runs_on_nvlink_and_beyond_it_on_the_nics():
    # H100 SXM: NVLink 4 at 450 GB/s per direction, 8 GPUs a board, a 400 Gb/s NIC (50 GB/s)
    inside, latency = _seconds("H100 SXM", "all_reduce", 8)
    assert inside == pytest.approx(64 * MB / 450e9 + latency)
    across, _ = _seconds("H100 SXM", "all_reduce", 16)
    assert across == pytest.approx(64 * MB / 50e9 + latency)


def test_an_all_to_all_over_eight_boards_splits_its_traffic_by_link():
    # B200 at 64 GPUs: 7 of a GPU's 63 peers on its board (900 GB/s), 56 beyond it (50 GB/s)
    seconds, latency = _seconds("B200", "all_to_all", 64, collectives=2)
    near, far = 64 * MB * 7 / 63 / 900e9, 64 * MB * 56 / 63 / 50e9
    assert seconds == pytest.approx(max(near, far) + 2 * latency)
    # B300's 800 Gb/s NIC halves the part beyond the board
    b300, _ = _seconds("B300", "all_to_all", 64, collectives=2)
    assert b300 == pytest.approx(far / 2 + 2 * latency)


def test_hardware_without_a_scale_out_figure_refuses_wider_layouts():
    with pytest.raises(PredictionRefused, match="all_reduce over 16 GPUs: wider than MI300X's "
                                                "8-GPU scale-up domain"):
        _seconds("MI300X", "all_reduce", 16)
    # a GB200 NVL72 rack is one domain: 64 GPUs stay on NVLink
    inside, latency = _seconds("GB200", "all_reduce", 64)
    assert inside == pytest.approx(64 * MB / 900e9 + latency)


def test_a_hardware_file_gives_both_figures(tmp_path):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(dict(name="Mine", vendor="NVIDIA", bf16_tflops=100, hbm_tbps=1,
                                    hbm_gb=10, interconnect_gbps=100, scale_up_gpus=4,
                                    scale_out_gbps=25, source="test")))
    hw = hardware.load_file(path)
    assert (hw.scale_up_gpus.value, hw.scale_out_gbps.value) == (4, 25)
    across, latency = _seconds(hw, "all_reduce", 8)
    assert across == pytest.approx(64 * MB / 25e9 + latency)


def test_a_row_wider_than_its_board_is_refused_and_such_a_layout_pays_the_nics():
    row = dict(id="r", silicon_data_source="source_file=runs.csv",
               model_path="deepseek-ai/DeepSeek-R1", system="b200_sxm", backend="trtllm",
               mode="agg", gemm_quant_mode="fp8", moe_quant_mode="fp8_block", isl="1024",
               osl="1024", batch_size="8", tp_size="64", pp_size="1", attention_dp_size="1",
               moe_tp_size="8", moe_ep_size="8", silicon_ttft_ms="100", silicon_tpot_ms="20")
    # aiconfigurator's fields count 64 GPUs; the source's ids name tp8_ep8: inconsistent
    with pytest.raises(PointRefused, match="tp_size 64 x attention_dp_size 1: 64 GPUs, more "
                                           "than one 8-GPU b200_sxm board"):
        from_silicon(row)
    # a 64-GPU layout asked for directly is priced over the NICs (gnomon's engine: the ring
    # model on the board too, where trtllm's all-reduce would take its measured times)
    kw = dict(model="deepseek-v3", hardware="B200", ep=8, weight_dtype="fp8", kv_dtype="fp8",
              engine="gnomon", num_requests=4, concurrency=2, rate=float("inf"),
              input_len=parse_length("128", "i"), output_len=parse_length("8", "o"))
    (wide, wide_trace), (board, board_trace) = (simulate(SimulationSpec.of(tp=64, **kw)),
                                                simulate(SimulationSpec.of(tp=8, **kw)))
    assert wide["metrics"]["tpot"]["mean"] > 0 and wide["setup"]["tp"] == 64

    def communication(trace):  # a decode step of both users'
        return next(s.breakdown["communication"] for s in trace.steps
                    if s.num_decode_tokens == 2 and not s.num_prefill_tokens)

    # the same 123 all-reduces of 2 tokens' hidden states a step (2 per layer and the
    # embedding's) and the all-gather of their float32 logits, over the NICs at 50 GB/s instead
    # of NVLink at 900: the bytes terms grow, the latency terms stay
    hidden, logits = 2 * 7168 * 2, 2 * 129280 * 4  # bf16 hidden states; vocab 129,280 divides
    grown = (123 * hidden * (2 * 63 / 64 / 50e9 - 2 * 7 / 8 / 900e9)
             + logits * (63 / 64 / 50e9 - 7 / 8 / 900e9))
    assert communication(wide_trace) - communication(board_trace) == pytest.approx(grown,
                                                                                   rel=0.05)
