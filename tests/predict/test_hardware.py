"""The hardware catalogue's interconnect figures, user hardware files, and ``host``."""

import json
import os
import textwrap

import pytest

from gnomon import hardware
from gnomon.predict.hardware import resolve_hardware

# per direction, GB/s: datasheets' bidirectional totals halved (NVLink 3 600, NVLink 4 900,
# NVLink 5 1800; AMD's 8-GPU mesh 7 links of 128 or 153.6; PCIe Gen4 x16 64, Gen5 x16 128)
INTERCONNECT = {"H100 SXM": 450, "H200": 450, "B200": 900, "MI300X": 7 * 64, "MI325X": 7 * 64,
                "MI355X": 7 * 153.6 / 2, "A100 SXM 80GB": 300, "H20": 450, "GB200": 900,
                "L40S": 32, "RTX PRO 6000 Blackwell": 64}


@pytest.mark.parametrize("name", list(INTERCONNECT))
def test_interconnect_per_direction(name):
    entry = hardware.gpu(name)
    assert entry.interconnect_gbps.value == pytest.approx(INTERCONNECT[name])
    assert "bidirectional" in entry.interconnect_gbps.source


def test_json_and_yaml_files(tmp_path):
    fields = {"name": "MI300A", "vendor": "AMD", "bf16_tflops": 980.6, "fp8_tflops": 1961.2,
              "hbm_tbps": 5.3, "hbm_gb": 128, "source": "AMD MI300A datasheet",
              "sources": {"hbm_gb": "AMD MI300A datasheet, unified HBM3"}}
    (tmp_path / "a.json").write_text(json.dumps(fields))
    yaml = pytest.importorskip("yaml")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(fields))
    for path in (tmp_path / "a.json", tmp_path / "a.yaml"):
        hw = resolve_hardware(str(path))
        assert hw.name == "MI300A" and hw.tflops("bfloat16") == 980.6
        assert hw.tflops("fp4") is None and hw.interconnect_gbps.value is None
        assert hw.hbm_gb.source == "AMD MI300A datasheet, unified HBM3"
        assert hw.hbm_tbps.source == "AMD MI300A datasheet"


@pytest.mark.parametrize("change, match", [
    ({"bf16_tflops": -1}, "bf16_tflops: expected a positive number"),
    ({"hbm_gb": None}, "hbm_gb: expected a positive number"),
    ({"name": ""}, "name: expected a non-empty string"),
    ({"clock_mhz": 2100}, "unknown field"),
    ({"fp8_tflops": "fast"}, "fp8_tflops"),
])
def test_bad_hardware_file(tmp_path, change, match):
    fields = {"name": "X", "vendor": "Y", "bf16_tflops": 1, "hbm_tbps": 1, "hbm_gb": 1}
    fields.update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match=match) as e:
        resolve_hardware(str(path))
    assert "bad.json" in str(e.value)


def test_missing_and_unparseable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="gone.json"):
        resolve_hardware(str(tmp_path / "gone.json"))
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="mapping"):
        resolve_hardware(str(tmp_path / "x.json"))


def test_host_is_measured_here():
    host = resolve_hardware("host")
    assert host.vendor == "host" and host.tflops("bfloat16") > 0 and host.hbm_tbps.value > 0
    assert "measured" in host.bf16_tflops.source
    assert resolve_hardware("HOST") is host  # measured once per process


def test_host_falls_back_to_the_nominal_rate_when_every_measured_one_is_implausible(
        monkeypatch):
    from gnomon.bench import machine
    from gnomon.predict import hardware as host_hardware

    nominal = machine.nominal_cpu_peaks(2, flags={"avx2", "fma"}, ghz=2.5, cores=2)
    slow = machine.cpu_peaks(20.0, {"float32": 1e-4, "bfloat16": 1e-4}, nominal, "test")
    assert slow["tflops"] == {}
    monkeypatch.setattr(machine, "measure_cpu_peaks", lambda llc, quick: slow)
    host_hardware.host.cache_clear()
    try:
        host = host_hardware.host()
        assert host.tflops("bfloat16") == pytest.approx(nominal["tflops"]["bfloat16"])
        assert "nominal" in host.bf16_tflops.source and "implausible" in host.bf16_tflops.source
    finally:
        host_hardware.host.cache_clear()


def test_null_means_none_and_missing_means_not_given(tmp_path):
    base = {"name": "X", "vendor": "NVIDIA", "bf16_tflops": 1, "hbm_tbps": 1, "hbm_gb": 1,
            "generation": "ampere"}
    (tmp_path / "null.json").write_text(json.dumps({**base, "fp8_tflops": None}))
    (tmp_path / "missing.json").write_text(json.dumps(base))
    null, missing = (resolve_hardware(str(tmp_path / f)) for f in ("null.json", "missing.json"))
    assert null.fp8_tflops.value is None and null.fp8_tflops.given
    assert missing.fp8_tflops.value is None and not missing.fp8_tflops.given
    assert null.generation == "ampere"


def test_bad_generation_names_the_field(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"name": "X", "vendor": "Y", "bf16_tflops": 1, "hbm_tbps": 1,
                                "hbm_gb": 1, "generation": "volta"}))
    with pytest.raises(ValueError, match="generation: expected one of ampere"):
        resolve_hardware(str(path))


def test_unknown_name_lists_everything():
    with pytest.raises(ValueError) as e:
        resolve_hardware("TPU v5")
    message = str(e.value)
    assert all(g.name in message for g in hardware.GPUS) and "host" in message
    assert ".json" in message


def test_the_readme_example_hardware_file_loads(tmp_path):
    yaml = pytest.importorskip("yaml")
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    block = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "hw.yaml"
    path.write_text(textwrap.dedent(block))
    hw = resolve_hardware(str(path))
    assert set(yaml.safe_load(path.read_text())) <= {f for f in hw.__dataclass_fields__} | {
        "source", "sources"}
    assert hw.generation == "cdna3" and hw.fp4_tflops.given and hw.fp4_tflops.value is None
    assert hw.hbm_tbps.source == "measured with rocm-bandwidth-test"
