"""`gnomon simulate` needs no torch: the simulation path imports none, runs where torch is not
installed, and the parts that do need it say which extra to install."""

import subprocess
import sys

SIMULATION_MODULES = [
    "gnomon.engine.llm", "gnomon.engine.scheduler", "gnomon.engine.kv_cache",
    "gnomon.engine.batch", "gnomon.engine.config", "gnomon.engine.config_json",
    "gnomon.engine.block_tables",
    "gnomon.predict.simulate", "gnomon.predict.serve", "gnomon.predict.simulated",
    "gnomon.predict.roofline", "gnomon.predict.calibrated", "gnomon.predict.table",
    "gnomon.predict.report", "gnomon.predict.metrics", "gnomon.predict.workloads",
]
HIDE_TORCH = "import sys; sys.modules['torch'] = None\n"  # `import torch` then fails


def _python(code, timeout=120):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


def test_gnomon_simulate_imports_no_torch():
    run = _python("import sys\nfrom gnomon.cli import main\n"
                  "assert main(['simulate', '--num-requests', '20']) == 0\n"
                  f"for m in {SIMULATION_MODULES!r}: __import__(m)\n"
                  "print('torch' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "False"


def test_gnomon_simulate_runs_without_torch_installed():
    run = _python(HIDE_TORCH + "from gnomon.cli import main\n"
                  "raise SystemExit(main(['simulate', '--num-requests', '20']))")
    assert run.returncode == 0, run.stderr
    assert "TTFT" in run.stdout


def test_the_parts_that_need_torch_name_the_extra():
    ops = _python(HIDE_TORCH + "import gnomon.ops")
    assert ops.returncode != 0
    assert "gnomon.ops needs torch" in ops.stderr and "gnomon[engine]" in ops.stderr
    for argv in (["bench", "--quick"], ["generate", "--model", "tiny-llama", "--random-weights",
                                        "--prompt-ids", "1,2"]):
        run = _python(HIDE_TORCH + f"from gnomon.cli import main\nraise SystemExit(main({argv!r}))")
        assert run.returncode == 2, (argv, run.stderr)
        assert f"gnomon {argv[0]} needs the engine extra" in run.stderr
        assert "gnomon[engine]" in run.stderr and "Traceback" not in run.stderr
