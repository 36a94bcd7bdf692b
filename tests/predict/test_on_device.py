"""`gnomon calibrate` and `gnomon validate` on a device: the device reaches every real run and
sweep, a GPU's family breakdown waits for its kernels, the simulation prices that GPU's
catalogue entry, and a device this build cannot run on is refused before any work. Run here
with the CPU; `bench/gpu_simulate.sh` runs them on a GPU."""

import math

import pytest
import torch

from gnomon import hardware
from gnomon.cli import main
from gnomon.engine import runner as runner_mod
from gnomon.engine.llm import LLMEngine
from gnomon.engine.models import weight_shapes
from gnomon.predict import calibrate as cal
from gnomon.predict import validate as val
from gnomon.predict.hardware import host, of_device
from gnomon.predict.shapes import ModelSpec
from gnomon.predict.simulated import TimedRunner, VirtualClock


def test_a_device_is_priced_as_its_catalogue_entry(monkeypatch):
    assert of_device("cpu") is host()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert of_device("cuda") is hardware.gpu("H200")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    with pytest.raises(ValueError, match="'NVIDIA H200 NVL', which no entry of the hardware "
                                         "catalogue reports"):
        of_device("cuda:0")


def test_a_family_timer_with_a_sync_waits_before_every_reading():
    calls = []
    tick = runner_mod._FamilyTimer(lambda: calls.append(1))
    tick("gemm")
    tick("attention")
    assert len(calls) == 3 and tick.seconds["gemm"] >= 0 and tick.seconds["attention"] >= 0


def test_a_timed_runner_asks_for_family_times_and_a_cpu_needs_no_sync():
    engine = LLMEngine("tiny-llama", random_weights=True, dtype="float32")
    asked = []
    real = engine.runner.time_families
    engine.runner.time_families = lambda: asked.append(1) or real()
    TimedRunner(engine.runner, VirtualClock())
    assert asked == [1] and engine.runner.timer_sync is None


def test_the_device_reaches_the_engine_and_the_gemm_sweep():
    spec = ModelSpec.from_model("tiny-llama")
    assert cal.calibration_engine(spec, "cuda:1").device == "cuda:1"
    rows = cal.gemm_sweep(spec, max_m=2, repeats=1, device="cpu")
    assert [len(ops) > 0 and seconds > 0 for ops, seconds in rows] == [True, True]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU can run it")
@pytest.mark.parametrize("command", [["calibrate", "--model", "tiny-llama"],
                                     ["validate", "--model", "tiny-llama"]])
def test_a_device_this_build_cannot_run_on_is_refused_before_any_work(command, capsys,
                                                                      monkeypatch):
    def ran(*args, **kwargs):
        raise AssertionError("work began before the device was checked")

    monkeypatch.setattr(cal, "real_run", ran)
    monkeypatch.setattr(val, "real_run", ran)
    assert main([*command, "--device", "cuda", "--out", "/dev/null"]) == 2
    assert "device" in capsys.readouterr().err


def test_validate_takes_a_model_and_names_one_it_does_not_know(capsys):
    assert main(["validate", "--model", "no-such-model"]) == 2
    assert "no-such-model" in capsys.readouterr().err


@pytest.mark.parametrize("name, params, layers", [("llama-1b", 1_235_814_400, 16),
                                                   ("gpt-oss-1b", 1_086_000_000, 4)])
def test_the_about_1b_presets(name, params, layers):
    config = ModelSpec.from_model(name).config
    assert config.num_layers == layers
    counted = sum(math.prod(shape) for n, shape in weight_shapes(config).items()
                  if not (n == "lm_head" and config.tie_word_embeddings))
    assert counted == pytest.approx(params, rel=0.01)
