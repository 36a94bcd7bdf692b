"""Machine fingerprint, commit resolution and peaks."""

import re
import socket
import subprocess

import pytest

from gnomon.bench import machine


def test_fingerprint_uses_stable_fields_only():
    first, second = machine.machine_info("cpu"), machine.machine_info("cpu")
    assert first == second
    assert re.fullmatch(r"[0-9a-f]{16}", first["fingerprint"])
    assert set(first) == {"fingerprint", "device", "cpu_model", "cores", "ram_gb", "gpu_name",
                          "driver", "runtime"}
    assert socket.gethostname() not in set(map(str, first.values())) - {first["cpu_model"]}
    assert isinstance(first["ram_gb"], int) and first["ram_gb"] >= 1
    assert first["gpu_name"] is None


def test_fingerprint_changes_with_a_stable_field(monkeypatch):
    before = machine.machine_info("cpu")["fingerprint"]
    monkeypatch.setattr(machine, "_ram_gb", lambda: 4096)
    assert machine.machine_info("cpu")["fingerprint"] != before


def test_commit_argument_is_validated():
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert machine.resolve_commit(sha.upper()) == sha
    with pytest.raises(ValueError, match="--commit: expected a full 40-hex-digit"):
        machine.resolve_commit("abc123")


def test_commit_is_read_from_the_current_checkout(tmp_path):
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run(git + ["-C", str(tmp_path), "add", "f"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "c"], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert machine.resolve_commit(None, cwd=tmp_path) == head


def test_no_checkout_and_no_commit_says_pass_commit(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "_git_head", lambda directory: None)
    with pytest.raises(ValueError, match="pass --commit SHA"):
        machine.resolve_commit(None, cwd=tmp_path)


def test_cpu_peaks_are_measured():
    peaks = machine.measure_cpu_peaks(1 << 20, quick=True)
    assert peaks["memory_gbps"] > 0.1
    assert set(peaks["tflops"]) == {"float32", "bfloat16"}
    assert all(v > 0 for v in peaks["tflops"].values())
    assert "measured in this run" in peaks["source"]


def test_gpu_peaks_come_from_the_catalogue_or_not_at_all():
    peaks = machine.gpu_peaks("NVIDIA H200")
    assert peaks["memory_gbps"] == 4800 and peaks["tflops"]["bfloat16"] == 989
    assert "fp4" not in peaks["tflops"]
    unknown = machine.gpu_peaks("NVIDIA A10")
    assert unknown["memory_gbps"] is None and unknown["tflops"] == {}
