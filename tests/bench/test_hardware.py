"""gnomon.hardware: the catalogue holds REFERENCE.md's datasheet numbers, each with a source."""

import dataclasses

import pytest

from gnomon import hardware

# (BF16, FP8, FP4, HBM TB/s, HBM GB) from shared/REFERENCE.md, dense, per GPU.
EXPECTED = {
    "H100 SXM": (989, 1979, None, 3.35, 80),
    "H200": (989, 1979, None, 4.8, 141),
    "B200": (2250, 4500, 9000, 8.0, 180),
    "MI300X": (1307.4, 2614.9, None, 5.3, 192),
    "MI325X": (1307.4, 2614.9, None, 6.0, 256),
    "MI355X": (2516.6, 5033, 10066, 8.0, 288),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_numbers_match_the_reference(name):
    gpu = hardware.gpu(name)
    figures = (gpu.bf16_tflops, gpu.fp8_tflops, gpu.fp4_tflops, gpu.hbm_tbps, gpu.hbm_gb)
    assert tuple(f.value for f in figures) == EXPECTED[name]
    for figure in figures:
        assert "datasheet" in figure.source


def test_catalogue_is_exactly_the_six_gpus_and_frozen():
    assert [g.name for g in hardware.GPUS] == list(EXPECTED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.H100_SXM.name = "x"


def test_lookup_ignores_case_spaces_and_dashes():
    assert hardware.gpu("h100-sxm") is hardware.H100_SXM
    assert hardware.gpu("H200 SXM") is hardware.H200
    assert hardware.gpu("mi355x") is hardware.MI355X


@pytest.mark.parametrize("bad", ["A100", "", "H100 PCIe", None])
def test_unknown_name_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match="known: H100 SXM, H200, B200, MI300X, MI325X, MI355X"):
        hardware.gpu(bad)


def test_device_names_match_exactly_or_not_at_all():
    assert hardware.from_device_name("NVIDIA H100 80GB HBM3") is hardware.H100_SXM
    assert hardware.from_device_name("AMD Instinct MI300X") is hardware.MI300X
    assert hardware.from_device_name("NVIDIA H100 PCIe") is None
    assert hardware.from_device_name("NVIDIA H200 NVL") is None


def test_tflops_by_dtype_name():
    assert hardware.B200.tflops("bfloat16") == 2250
    assert hardware.B200.tflops("fp4") == 9000
    assert hardware.H100_SXM.tflops("fp4") is None
    assert hardware.H100_SXM.tflops("float32") is None
