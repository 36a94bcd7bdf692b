"""`gnomon sweep`: the grid, refusals, the frontier, executors that agree, resume, the one-owner
lock, interrupted sweeps and the plot."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gnomon.predict import sweep
from gnomon.predict.spec import SimulationSpec
from gnomon.predict.sweep import Row, SweepSpec

BASE = {"model": "llama-3.1-8b", "workload": "random", "num_requests": 24, "input_len": "48",
        "output_len": "16", "rate": "inf", "seed": 3}
GRID = {"hardware": ["H100", "MI300X"], "tp": [1, 2], "concurrency": [4, 16]}


def _row(gpu, user, name="x"):
    return Row({"name": name}, gpu, user, 0.1, 1 / user)


def test_the_frontier_keeps_what_nothing_beats_and_every_tie():
    a, b, c = _row(100, 10, "a"), _row(60, 30, "b"), _row(20, 50, "c")
    dominated = [_row(90, 10, "under a"), _row(60, 20, "under b"), _row(10, 10, "under all")]
    tie = _row(60, 30, "b again")
    front = sweep.pareto([a, b, c, tie, *dominated])
    assert [r.point["name"] for r in front] == ["a", "b", "b again", "c"]
    assert sweep.pareto([]) == []
    assert sweep.pareto([a]) == [a]


def test_slo_and_cost():
    row = Row({"hardware": "H100"}, per_gpu=1000.0, per_user=50.0, ttft_s=0.4, tpot_s=0.02)
    assert sweep.meets_slo(row, 0.5, 0.02) and not sweep.meets_slo(row, 0.3, None)
    assert sweep.usd_per_million_tokens(row, {"H100": 3.6}) == pytest.approx(1.0)
    assert sweep.usd_per_million_tokens(row, {}) is None
    assert sweep.parse_prices("H100=2.5, MI300X=2.1") == {"H100": 2.5, "MI300X": 2.1}
    for bad in ("H100", "H100=x", "H100=-1", "=2"):
        with pytest.raises(ValueError, match="--cost-per-gpu-hour"):
            sweep.parse_prices(bad)


def test_a_spec_names_what_it_cannot_take(tmp_path):
    with pytest.raises(ValueError, match="unknown colour"):
        SweepSpec(BASE, {"colour": [1]})
    with pytest.raises(ValueError, match="rate: given both"):
        SweepSpec(BASE, {"rate": [1, 2]})
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: tiny-llama\ngrid:\n  tp: [1, 2]\n  hardware: H100\n")
    loaded = SweepSpec.from_file(spec)
    assert loaded.points() == [{"hardware": "H100", "tp": 1}, {"hardware": "H100", "tp": 2}]
    (tmp_path / "bad.yaml").write_text("model: x\n")
    with pytest.raises(ValueError, match="bad.yaml: expected an object with a 'grid'"):
        SweepSpec.from_file(tmp_path / "bad.yaml")


def _strip(doc):
    """The document without what depends on where and when it ran."""
    doc = json.loads(json.dumps(doc))
    for record in doc["points"]:
        for name in ("host", "pid", "wall_seconds"):
            record.pop(name)
        if "report" in record:
            record["report"].pop("wall_seconds")
    return doc


@pytest.fixture(scope="module")
def inline():
    return sweep.run_sweep(SweepSpec(BASE, GRID), jobs=1)


def test_a_2x2x2_grid_runs_every_point_in_grid_order(inline):
    assert [r["point"] for r in inline["points"]] == SweepSpec(BASE, GRID).points()
    assert len(inline["points"]) == 8
    assert all(r["status"] == "complete" for r in inline["points"])
    sweep.validate(inline)


def test_the_document_holds_its_frontier_its_bounds_and_its_prices():
    bounds = {"max_tpot_s": 0.004, "usd_per_gpu_hour": {"H100": 3.6}}
    doc = sweep.run_sweep(SweepSpec(BASE, GRID, bounds), jobs=1)
    assert doc["schema_version"] == sweep.SCHEMA_VERSION == 4 and doc["spec"]["frontier"] == bounds
    complete = [r for r in doc["points"] if r["status"] == "complete"]
    rows = {sweep.point_key(r["point"]): r for r in complete}
    # the frontier recomputed here by hand: the points within the bound no other one beats
    kept = [r for r in sweep.rows(doc) if r.tpot_s <= 0.004]
    assert 0 < len(kept) < len(complete)
    beaten = {sweep.point_key(r.point) for r in kept for o in kept
              if o.per_gpu >= r.per_gpu and o.per_user >= r.per_user
              and (o.per_gpu, o.per_user) != (r.per_gpu, r.per_user)}
    want = sorted((r for r in kept if sweep.point_key(r.point) not in beaten),
                  key=lambda r: r.per_user)
    assert [f["point"] for f in doc["frontier"]] == [r.point for r in want]
    assert {k for k, r in rows.items() if r["on_frontier"]} == \
        {sweep.point_key(r.point) for r in want}
    for f in doc["frontier"]:
        record = rows[sweep.point_key(f["point"])]
        t = record["report"]["metrics"]["throughput"]
        assert f["output_tokens_per_s_per_gpu"] == t["output_tokens_per_s_per_gpu"]
        assert f["tpot_s"] <= 0.004
    # a price per hardware: only the H100 points carry a cost, the frontier entries too
    for r in complete:
        per_gpu = r["report"]["metrics"]["throughput"]["output_tokens_per_s_per_gpu"]
        if r["point"]["hardware"] == "H100":
            assert r["usd_per_million_output_tokens"] == pytest.approx(3.6 / (per_gpu * 3600) * 1e6)
        else:
            assert "usd_per_million_output_tokens" not in r
    assert all((f["usd_per_million_output_tokens"] is None) == (f["point"]["hardware"] != "H100")
               for f in doc["frontier"])
    sweep.validate(doc)


def test_a_spec_refuses_a_frontier_it_cannot_use(tmp_path):
    with pytest.raises(ValueError, match="sweep frontier: unknown colour"):
        SweepSpec(BASE, GRID, {"colour": 1})
    with pytest.raises(ValueError, match="max_ttft_s: expected seconds > 0"):
        SweepSpec(BASE, GRID, {"max_ttft_s": -1})
    with pytest.raises(ValueError, match="usd_per_gpu_hour: expected"):
        SweepSpec(BASE, GRID, {"usd_per_gpu_hour": {"H100": 0}})
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: tiny-llama\ngrid:\n  tp: [1, 2]\nfrontier:\n  max_tpot_s: 0.05\n")
    assert SweepSpec.from_file(spec).frontier == {"max_tpot_s": 0.05}


def test_local_processes_give_the_same_document(inline):
    assert _strip(sweep.run_sweep(SweepSpec(BASE, GRID), jobs=2)) == _strip(inline)


def test_ray_gives_the_same_document(inline):
    if os.environ.get("CI") != "true":
        pytest.importorskip("ray", reason="gnomon[ray] is not installed")
    import ray

    try:
        doc = sweep.run_sweep(SweepSpec(BASE, GRID), use_ray=True)
    finally:
        ray.shutdown()
    assert _strip(doc) == _strip(inline)


@pytest.mark.timing
def test_an_unreachable_ray_address_fails_fast_naming_it():
    pytest.importorskip("ray", reason="gnomon[ray] is not installed")
    start = time.monotonic()
    with pytest.raises(ValueError, match="--ray 127.0.0.1:9: no Ray cluster answers there"):
        sweep.run_sweep(SweepSpec(BASE, {"tp": [1]}), use_ray=True, ray_address="127.0.0.1:9")
    assert time.monotonic() - start < 30


def test_points_that_cannot_run_are_listed_with_their_reason():
    doc = sweep.run_sweep(SweepSpec(BASE, {"tp": [1, 3]}), jobs=1)
    ok, refused = doc["points"]
    assert ok["status"] == "complete" and refused["status"] == "refused"
    assert "tp: 3 does not divide the 32 attention heads" in refused["reason"]


def test_resume_runs_only_what_is_missing_or_cut_short(tmp_path, monkeypatch):
    out = tmp_path / "sweep.json"
    spec = SweepSpec(BASE, {"concurrency": [2, 4, 8]})
    first = sweep.run_sweep(spec, out=out)
    doc = json.loads(out.read_text())
    doc["points"] = doc["points"][:2]
    doc["points"][1]["status"] = "complete"
    del doc["points"][1]["report"]  # marked complete, but its result is missing
    out.write_text(json.dumps(doc))
    ran = []
    real = sweep.run_point
    monkeypatch.setattr(sweep, "run_point", lambda b, p: ran.append(p) or real(b, p))
    again = sweep.run_sweep(spec, out=out, resume=True)
    assert ran == [{"concurrency": 4}, {"concurrency": 8}]
    assert _strip(again) == _strip(first)
    with pytest.raises(ValueError, match="exists; pass --resume"):
        sweep.run_sweep(spec, out=out)
    other = SweepSpec({**BASE, "seed": 4}, {"concurrency": [2, 4, 8]})
    with pytest.raises(ValueError, match="made with seed 3, this sweep has 4"):
        sweep.run_sweep(other, out=out, resume=True)


OWNER = """
import sys, time
from pathlib import Path
from gnomon.predict.sweep import OutputLock
lock = OutputLock(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_sweep_on_a_live_sweeps_output_is_refused_naming_the_owner(tmp_path):
    out = tmp_path / "sweep.json"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(out)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"another sweep owns it \(pid {owner.pid} on "):
            sweep.run_sweep(SweepSpec(BASE, {"tp": [1]}), out=out)
    finally:
        owner.kill()
        owner.wait(10)
    doc = sweep.run_sweep(SweepSpec(BASE, {"tp": [1]}), out=out)  # its owner is gone
    assert len(doc["points"]) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_sweep_killed_midway_leaves_a_valid_file(tmp_path, sig):
    out = tmp_path / "sweep.json"
    run = subprocess.Popen([sys.executable, "-m", "gnomon.cli", "sweep", "--model", "llama-3.1-8b",
                            "--workload", "random", "--num-requests", "600", "--input-len", "48",
                            "--output-len", "16", "--rate", "inf", "--seed", "3",
                            "--concurrency", ",".join(str(c) for c in range(1, 40)),
                            "--jobs", "1", "--out", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    run.send_signal(sig)
    run.wait(30)
    doc = sweep.load(out)  # whole, whatever the moment
    assert 1 <= len(doc["points"]) < 39 and len(sweep.done_points(doc)) == len(doc["points"])
    spec = SweepSpec(SimulationSpec.from_json(doc["spec"]["base"]),
                     {"concurrency": list(range(1, 40))})
    assert spec.base.workload.num_requests == 600 and len(spec.points()) == 39
    sweep.OutputLock(out).release()  # the lock died with the process: a resume may take it


def test_the_plot_marks_the_frontier(inline, tmp_path):
    from matplotlib import image

    path = tmp_path / "frontier.png"
    sweep.plot(inline, path)
    assert path.stat().st_size > 20_000
    pixels = image.imread(path)[..., :3]
    assert pixels.shape[0] > 400 and pixels.shape[1] > 600
    assert (pixels.min(axis=2) < 0.5).mean() > 0.01  # not blank: lines, marks, labels


def test_a_filesystem_without_locks_refuses_the_sweep(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ValueError, match="cannot take the lock .* on this filesystem"):
        sweep.run_sweep(SweepSpec(BASE, {"tp": [1]}), out=tmp_path / "s.json", resume=True)


NO_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; from gnomon import cli; "
                 "sys.exit(cli.main(sys.argv[1:]))")


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_plot_without_matplotlib_is_refused_before_any_point_runs(tmp_path, command):
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, command, "--model",
                          "llama-3.1-8b", "--num-requests", "5", "--out", str(out), "--plot",
                          str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--plot needs matplotlib" in run.stderr, run.stderr
    assert not out.exists()  # nothing ran


def test_the_cli_prints_the_frontier_and_the_refusals(tmp_path):
    run = subprocess.run([sys.executable, "-m", "gnomon.cli", "sweep", "--model", "llama-3.1-8b",
                          "--workload", "random", "--num-requests", "24", "--input-len", "48",
                          "--output-len", "16", "--rate", "inf", "--tp", "1,3",
                          "--concurrency", "4,16", "--jobs", "1",
                          "--cost-per-gpu-hour", "MI355X=3", "--slo-tpot-ms", "500",
                          "--out", str(tmp_path / "s.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Pareto frontier" in run.stdout and "tp1 c16" in run.stdout
    doc = sweep.load(tmp_path / "s.json")  # the printed answer is in the document
    assert doc["spec"]["frontier"] == {"max_tpot_s": 0.5, "usd_per_gpu_hour": {"MI355X": 3.0}}
    assert doc["frontier"] and all(f["usd_per_million_output_tokens"] > 0
                                   for f in doc["frontier"])
    assert run.stdout.count("refused") == 2  # tp 3 at both concurrencies
    assert "tp: 3 does not divide the 32 attention heads" in run.stdout


def _worker_limit(base, point):
    import resource

    return {"point": point, "limit": resource.getrlimit(resource.RLIMIT_AS)[0]}


def test_pool_workers_run_under_a_memory_cap_and_a_point_past_it_is_refused_by_name():
    # the cap makes a runaway point raise MemoryError in its own worker (recorded as refused),
    # where the kernel's out-of-memory killer would end the pool and the run
    records = list(sweep._local_results({}, [{"i": 0}, {"i": 1}], 2, task=_worker_limit))
    assert [r["limit"] for r in records] == [sweep.worker_memory_cap(2)] * 2
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert sweep.worker_memory_cap(2) == max(int(total * 0.85 / 2), 2 << 30)
    assert "ran out of its worker's memory" in sweep.out_of_memory()


def _worker_pid(base, point):
    return {"point": point, "pid": os.getpid()}


def test_pool_workers_are_replaced_after_their_share_of_points():
    n = 2 * sweep.TASKS_PER_WORKER + 1
    records = list(sweep._local_results({}, [{"i": i} for i in range(n)], 2, task=_worker_pid))
    pids = {r["pid"] for r in records}
    assert len(records) == n and len(pids) >= 3
