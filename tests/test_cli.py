"""`gnomon info` and what the build holds."""

import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import gnomon
from gnomon import _C, cli


def test_info_prints_what_the_build_holds(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"gnomon {gnomon.__version__}\n")
    for label in ("compiler:", "build:", "simd:", "gpu backends:", "threads:"):
        assert re.search(rf"^{label} +\S", out, re.M), label
    from gnomon.ops import num_threads

    assert f"threads:      {num_threads()}" in out


def test_info_json_has_every_field(capsys):
    cli.main(["info", "--json"])
    info = json.loads(capsys.readouterr().out)
    assert set(info) == {"version", "compiler", "build_type", "cxx_flags", "sanitizers",
                         "simd_compiled", "simd_cpu", "gpu_backends", "gpu_architectures",
                         "num_threads", "kernel_paths", "compiled_modules", "pure_python"}
    # a CPU-only build names no architectures; a GPU build names the ones compiled in
    assert bool(info["gpu_backends"]) == bool(info["gpu_architectures"])
    assert info["version"] == metadata.version("gnomon")
    assert info["num_threads"] >= 1


@pytest.mark.parametrize("cap", [None, "narrow", "wide", "bf16"])
def test_info_names_the_path_each_op_family_runs(cap, capsys, monkeypatch):
    """The kernel families follow the GNOMON_CPU_KERNELS cap (never above what the CPU has);
    the norms' row helpers are the clone picked at load time, which no cap moves."""
    if cap is not None:
        monkeypatch.setenv("GNOMON_CPU_KERNELS", cap)
    cli.main(["info", "--json"])
    paths = json.loads(capsys.readouterr().out)["kernel_paths"]
    assert set(paths) == {"paged_attention", "fused_moe", "mxfp4_gemm", "rms_norm",
                          "rotary_embedding"}
    family = {paths[op] for op in ("paged_attention", "fused_moe", "mxfp4_gemm")}
    assert family == {_C.cpu_kernel_isa()}
    has_avx512 = {"avx512f", "avx512bw", "avx512vl"} <= set(_C.build_info()["simd_cpu"])
    if cap == "narrow" or not has_avx512:
        assert family <= {"avx2", "portable"}
    elif cap == "wide":
        assert family == {"avx512"}
    elif cap == "bf16":
        assert family <= {"avx512-bf16", "avx512"}
    assert paths["rms_norm"] == paths["rotary_embedding"]
    assert paths["rms_norm"] in ("avx512", "avx2", "portable")
    cli.main(["info"])
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("cpu kernels:"))
    printed = {op: path for group in line.removeprefix("cpu kernels:").strip().split("; ")
               for ops, path in [group.split(": ")] for op in ops.split(", ")}
    assert printed == paths


def test_release_build_is_optimised():
    info = _C.build_info()
    if info["build_type"] == "Release":
        assert "-O3" in info["cxx_flags"].split()


def test_console_script_is_installed():
    script = shutil.which("gnomon")
    assert script is not None, "the gnomon console script is not on PATH"
    result = subprocess.run([script, "info"], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("gnomon ")


def test_unknown_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_importing_gnomon_does_not_import_torch():
    code = "import sys, gnomon; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_extension_links_no_libtorch():
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run([readelf, "-d", _C.__file__], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed, dynamic
    assert not [lib for lib in needed if re.search(r"torch|c10", lib)], needed


def test_thread_count_rejects_non_positive():
    before = _C.num_threads()
    with pytest.raises(ValueError, match="num_threads"):
        _C.set_num_threads(0)
    assert _C.num_threads() == before
    _C.set_num_threads(before)


def test_readme_quick_start_has_exactly_two_commands():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    section = readme.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip()]
    assert commands == ['pip install . && gnomon simulate',
                        'pip install ".[test]" && python -m pytest']
