"""gnomon.hardware: the catalogue holds datasheet numbers, and the memory NVIDIA's devices report,
each with a source."""

import dataclasses

import pytest

from gnomon import hardware

# (BF16, FP8, FP4, HBM TB/s, HBM GB), dense, per GPU device, from each vendor's datasheet
# (H20, RTX PRO 6000 and B300 from third-party copies of NVIDIA's tables; GB200 from the NVL72
# rack's sparse figures / 72 / 2; B300 from HGX B300's per 8 GPUs, sparse halved, and DGX
# B300's dense FP4; MI250X one GCD, half the package). HBM GB is 1e9 bytes: for the NVIDIA GPUs
# whose reported memory is published, what the device reports (nvidia-smi's total: an H100
# reports 81,559 MiB), since an engine's memory fraction multiplies that; a datasheet's "80 GB" is
# 80 GiB of HBM stacks.
EXPECTED = {
    "A100 SXM 40GB": (312, None, None, 1.555, 42.95),
    "A100 SXM 80GB": (312, None, None, 2.039, 85.90),
    "H100 SXM": (989, 1979, None, 3.35, 85.52),
    "H200": (989, 1979, None, 4.8, 151.40),
    "H20": (148, 296, None, 4.0, 96),
    "L40S": (362.05, 733, None, 0.864, 48.31),
    "RTX PRO 6000 Blackwell": (503.8, 1010, 2020, 1.792, 102.64),
    "B200": (2250, 4500, 9000, 8.0, 193.27),
    "B300": (2250, 4500, 13500, 8.0, 288.40),
    "GB200": (2500, 5000, 10000, 8.0, 198.67),
    "MI250X": (191.5, None, None, 1.6, 64),
    "MI300X": (1307.4, 2614.9, None, 5.3, 192),
    "MI300A": (980.6, 1961.2, None, 5.3, 128),
    "MI325X": (1307.4, 2614.9, None, 6.0, 256),
    "MI355X": (2516.6, 5033, 10066, 8.0, 288),
}
REPORTED = ("A100 SXM 40GB", "A100 SXM 80GB", "H100 SXM", "H200", "L40S",
            "RTX PRO 6000 Blackwell", "B200", "B300", "GB200")
DATASHEETS = ("H100 SXM", "H200", "B200", "MI300X", "MI325X", "MI355X", "A100 SXM 40GB",
              "A100 SXM 80GB", "L40S", "MI250X", "MI300A")


@pytest.mark.parametrize("name", list(EXPECTED))
def test_numbers_match_the_datasheets(name):
    gpu = hardware.gpu(name)
    figures = (gpu.bf16_tflops, gpu.fp8_tflops, gpu.fp4_tflops, gpu.hbm_tbps, gpu.hbm_gb)
    assert tuple(f.value for f in figures) == EXPECTED[name]
    for figure in figures:
        assert figure.given and figure.source
        if figure is gpu.hbm_gb and name in REPORTED:
            assert "reports" in figure.source or "nvidia-smi" in figure.source
        elif name in DATASHEETS:
            assert "datasheet" in figure.source
    assert gpu.generation in hardware.GENERATIONS


def test_catalogue_is_exactly_these_gpus_and_frozen():
    assert [g.name for g in hardware.GPUS] == list(EXPECTED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.H100_SXM.name = "x"


# (GPUs one NVLink or Infinity Fabric domain joins, scale-out GB/s per GPU and direction)
SCALE = {"H100 SXM": (8, 50), "H200": (8, 50), "B200": (8, 50), "B300": (8, 100),
         "GB200": (72, None), "MI300X": (8, None), "MI325X": (8, None), "MI355X": (8, None)}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scale_up_and_scale_out_figures(name):
    gpu = hardware.gpu(name)
    assert (gpu.scale_up_gpus.value, gpu.scale_out_gbps.value) == SCALE.get(name, (None, None))
    for figure in (gpu.scale_up_gpus, gpu.scale_out_gbps):
        assert figure.given == (figure.value is not None) and figure.source


def test_lookup_ignores_case_spaces_and_dashes():
    assert hardware.gpu("h100-sxm") is hardware.H100_SXM
    assert hardware.gpu("H200 SXM") is hardware.H200
    assert hardware.gpu("mi355x") is hardware.MI355X


@pytest.mark.parametrize("bad", ["TPU v5", "", "H100 PCIe", None])
def test_unknown_name_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match="known: A100 SXM 40GB, A100 SXM 80GB, H100 SXM"):
        hardware.gpu(bad)


def test_aliases():
    assert hardware.gpu("A100") is hardware.A100_80GB
    assert hardware.gpu("rtx-pro-6000") is hardware.RTX_PRO_6000


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
