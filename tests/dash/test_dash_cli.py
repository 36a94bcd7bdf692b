"""`gnomon dash ingest|compare|history|ack` through the CLI, and `site_data`."""

import json
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa

from dash.synthetic import KEYS, document, sha, write
from gnomon import cli
from gnomon.dash import comparison, site_data, store

SLOW_KEY = "attention/paged_attention[batch=8,ctx=1024]"
FAST_KEY = "norm/rms_norm[tokens=512,hidden=4096]"


def dash(db, *args):
    return cli.main(["dash", *args, "--db", db])


@pytest.fixture
def db(tmp_path):
    return f"sqlite:///{tmp_path / 'bench.sqlite'}"


@pytest.fixture
def two_commits(db, tmp_path):
    """BASE and HEAD with 8 runs each; HEAD makes SLOW_KEY 15% slower, FAST_KEY 15% faster."""
    base = write(document(sha("base"), runs=8, seed=1), tmp_path / "base.json")
    head = write(document(sha("head"), runs=8, seed=2,
                          factors={SLOW_KEY: 1.15, FAST_KEY: 0.85}), tmp_path / "head.json")
    assert dash(db, "ingest", str(base), str(head)) == 0
    return sha("base"), sha("head")


def error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnomon: error: "), err
    return err[0]


def test_compare_flags_the_planted_regression_and_exits_1(db, two_commits, tmp_path, capsys):
    base, head = two_commits
    capsys.readouterr()
    markdown = tmp_path / "pr.md"
    assert dash(db, "compare", base[:8], head[:10], "--markdown", str(markdown)) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "IMPROVEMENT" in out and "SAME" in out
    row = next(line for line in out.splitlines() if SLOW_KEY in line)  # keys print whole
    assert "REGRESSION" in row
    text = markdown.read_text()
    lines = {line.split("|")[1].strip(" `"): line for line in text.splitlines()
             if line.startswith("| `")}
    assert "REGRESSION" in lines[SLOW_KEY] and "IMPROVEMENT" in lines[FAST_KEY]
    assert "SAME" in lines["moe/fused_moe[tokens=64,experts=8]"]
    # the other way round the improvement is a regression
    assert dash(db, "compare", head, base) == 1
    # a 20% threshold for paged_attention turns its 15% into SAME
    assert dash(db, "compare", base, head, "--threshold-op", "paged_attention=20%") == 0
    assert dash(db, "compare", base, head, "--threshold", "30%") == 0


def test_compare_with_three_runs_flags_a_30_percent_slowdown(db, tmp_path, capsys):
    base = write(document(sha("b3"), runs=3, seed=1), tmp_path / "b.json")
    head = write(document(sha("h3"), runs=3, seed=2, factors={SLOW_KEY: 1.3}), tmp_path / "h.json")
    assert dash(db, "ingest", str(base), str(head)) == 0
    assert dash(db, "compare", sha("b3"), sha("h3")) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if SLOW_KEY in line)
    assert "REGRESSION" in row


def test_one_run_each_is_ambiguous_without_history_and_judged_with_it(db, tmp_path, capsys):
    base = write(document(sha("b1"), runs=1, seed=1), tmp_path / "b.json")
    head = write(document(sha("h1"), runs=1, seed=2, factors={SLOW_KEY: 1.5}),
                 tmp_path / "h.json")
    assert dash(db, "ingest", str(base), str(head)) == 0
    capsys.readouterr()
    assert dash(db, "compare", sha("b1"), sha("h1")) == 3  # no noise model: not a pass
    assert "cannot measure the noise" in capsys.readouterr().out
    assert dash(db, "compare", sha("b1"), sha("h1"), "--allow-ambiguous") == 0
    # eight earlier commits at the base's level are the noise model a single run lacks
    past = [write(document(sha(f"past{i}"), runs=1, seed=10 + i), tmp_path / f"p{i}.json")
            for i in range(8)]
    ordered = f"sqlite:///{tmp_path / 'ordered.sqlite'}"
    assert dash(ordered, "ingest", *map(str, past), str(base), str(head)) == 0
    capsys.readouterr()
    assert dash(ordered, "compare", sha("b1"), sha("h1")) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in next(line for line in out.splitlines() if SLOW_KEY in line)
    assert "0 AMBIGUOUS" in out


def test_a_machine_slower_for_every_key_is_ambiguous_and_a_key_beyond_it_still_regresses(
        db, tmp_path, capsys):
    everything = {key: 1.08 for key in KEYS}
    base = write(document(sha("bm"), runs=3, seed=1), tmp_path / "b.json")
    slow = write(document(sha("hm"), runs=3, seed=2, factors=everything), tmp_path / "h.json")
    both = write(document(sha("hb"), runs=3, seed=3, factors={**everything, SLOW_KEY: 1.5}),
                 tmp_path / "hb.json")
    assert dash(db, "ingest", str(base), str(slow), str(both)) == 0
    capsys.readouterr()
    assert dash(db, "compare", sha("bm"), sha("hm")) == 3
    out = capsys.readouterr().out
    assert "0 REGRESSION" in out and "with every key" in out
    assert "on every key at once" in out
    assert dash(db, "compare", sha("bm"), sha("hb")) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if SLOW_KEY in line)
    assert "REGRESSION" in row


def test_keys_at_one_commit_only_are_new_or_gone_and_do_not_fail(db, tmp_path, capsys):
    only = {"extra/new_case[n=1]": ("extra", "new_case")}
    base = write(document(sha("bn"), runs=3, seed=1), tmp_path / "b.json")
    head = write(document(sha("hn"), runs=3, seed=2, keys={**KEYS, **only}), tmp_path / "h.json")
    assert dash(db, "ingest", str(base), str(head)) == 0
    assert dash(db, "compare", sha("bn"), sha("hn")) == 0
    assert "NEW" in next(line for line in capsys.readouterr().out.splitlines()
                         if "extra/new_case" in line)
    assert dash(db, "compare", sha("hn"), sha("bn")) == 0
    assert "GONE" in next(line for line in capsys.readouterr().out.splitlines()
                          if "extra/new_case" in line)


def test_the_exit_status_is_the_worst_verdict_and_only_ambiguity_can_be_allowed():
    exit_code = comparison.exit_code
    passing = ["SAME", "IMPROVEMENT", "NEW", "GONE"]
    assert exit_code(passing) == 0 and exit_code([]) == 0
    assert exit_code([*passing, "AMBIGUOUS"]) == 3
    assert exit_code([*passing, "AMBIGUOUS"], allow_ambiguous=True) == 0
    assert exit_code(["AMBIGUOUS", "REGRESSION"], allow_ambiguous=True) == 1


def test_compare_usage_errors_exit_2(db, two_commits, tmp_path, capsys):
    base, head = two_commits
    capsys.readouterr()
    assert dash(db, "compare", "deadbeef", head) == 2
    assert "deadbeef" in error_line(capsys)
    assert dash(db, "compare", "nothex", head) == 2
    error_line(capsys)
    assert dash(db, "compare", base, head, "--threshold", "5") == 2
    assert "--threshold" in error_line(capsys)
    assert dash(db, "compare", base, head, "--threshold-op", "nosuchop=5%") == 2
    assert "nosuchop" in error_line(capsys)
    assert dash(db, "compare", base, head, "--machine", "ffff") == 2
    assert "no such machine" in error_line(capsys)
    # an ambiguous prefix: two commits sharing a first digit
    shas = [sha(f"x{i}") for i in range(40)]
    first, second = next((a, b) for a in shas for b in shas if a != b and a[0] == b[0])
    for name, commit in (("p", first), ("q", second)):
        write(document(commit), tmp_path / f"{name}.json")
    assert dash(db, "ingest", str(tmp_path / "p.json"), str(tmp_path / "q.json")) == 0
    capsys.readouterr()
    assert dash(db, "compare", first[0], head) == 2
    assert "ambiguous" in error_line(capsys)
    # a second machine with both commits: --machine becomes necessary
    for name, commit in (("m2b", base), ("m2h", head)):
        write(document(commit, machine_name="other"), tmp_path / f"{name}.json")
    assert dash(db, "ingest", str(tmp_path / "m2b.json"), str(tmp_path / "m2h.json")) == 0
    capsys.readouterr()
    assert dash(db, "compare", base, head) == 2
    assert "--machine" in error_line(capsys)
    fingerprint = document(base)["machine"]["fingerprint"]
    assert dash(db, "compare", base, head, "--machine", fingerprint[:6]) == 1


def test_ingest_errors_exit_2_and_write_nothing(db, two_commits, tmp_path, capsys):
    engine = store.open_engine(db)
    before = store.row_counts(engine)
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "kind"')
    good = write(document(sha("new")), tmp_path / "new.json")
    capsys.readouterr()
    assert dash(db, "ingest", str(good), str(bad)) == 2
    assert "bad.json" in error_line(capsys)
    assert store.row_counts(engine) == before
    engine.dispose()


def test_newer_schema_is_refused_by_the_cli(db, two_commits, capsys):
    engine = store.open_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.update(store.schema_version).values(version=store.SCHEMA_VERSION + 1))
    engine.dispose()
    capsys.readouterr()
    assert dash(db, "compare", *two_commits) == 2
    assert f"schema version {store.SCHEMA_VERSION + 1}" in error_line(capsys)


def test_compare_exit_code_in_a_subprocess(db, two_commits):
    env = dict(os.environ, GNOMON_DB=db)  # the gnomon this interpreter imports
    run = subprocess.run([sys.executable, "-m", "gnomon.cli", "dash", "compare", *two_commits],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "REGRESSION" in run.stdout and not run.stderr


def _history(db, tmp_path, levels, runs=3):
    """One commit per level of SLOW_KEY (other keys flat), ingested in order."""
    for i, level in enumerate(levels):
        path = write(document(sha(f"h{i}"), runs=runs, seed=i, factors={SLOW_KEY: level},
                              run_noise=0.005), tmp_path / f"h{i}.json")
        assert dash(db, "ingest", str(path)) == 0


def _steps(db):
    engine = store.open_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(store.steps, store.benchmarks.c.key).join(
            store.benchmarks, store.benchmarks.c.id == store.steps.c.benchmark_id)).all()
    engine.dispose()
    return rows


def test_history_records_a_step_and_ack_stores_the_reason(db, tmp_path, capsys):
    _history(db, tmp_path, [1.0] * 6 + [1.1] * 4)
    assert dash(db, "history") == 0
    out = capsys.readouterr().out
    assert SLOW_KEY in out and "open" in out
    rows = _steps(db)
    assert [(r.key, r.commit, r.state) for r in rows] == [(SLOW_KEY, sha("h6"), "open")]
    assert rows[0].ratio == pytest.approx(1.1, rel=0.02) and rows[0].q < 0.01

    assert dash(db, "ack", "moe/nothing[x=1]", "--reason", "x") == 2
    assert "moe/nothing[x=1]" in error_line(capsys)
    assert dash(db, "ack", FAST_KEY, "--reason", "x") == 2
    assert "no open step" in error_line(capsys)
    assert dash(db, "ack", SLOW_KEY, "--reason", "larger tile, expected") == 0
    assert [(r.state, r.reason) for r in _steps(db)] == [("acknowledged",
                                                          "larger tile, expected")]
    # history again keeps the acknowledgement
    assert dash(db, "history") == 0
    assert [(r.state, r.reason) for r in _steps(db)] == [("acknowledged",
                                                          "larger tile, expected")]


def test_a_reverted_step_becomes_fixed(db, tmp_path):
    _history(db, tmp_path, [1.0] * 5 + [1.1] * 4 + [1.0] * 4)
    assert dash(db, "history") == 0
    states = {r.commit: (r.state, r.ratio > 1) for r in _steps(db)}
    assert states == {sha("h5"): ("fixed", True), sha("h9"): ("open", False)}


def test_flat_history_has_no_steps(db, tmp_path, capsys):
    _history(db, tmp_path, [1.0] * 8)
    assert dash(db, "history") == 0
    assert "no steps" in capsys.readouterr().out and _steps(db) == []


def test_site_data_has_the_promised_shape(db, tmp_path):
    _history(db, tmp_path, [1.0] * 6 + [1.1] * 4)
    assert dash(db, "ack", SLOW_KEY, "--reason", "r") == 2  # nothing stored yet
    assert dash(db, "history") == 0
    engine = store.open_engine(db)
    data = site_data(engine)
    engine.dispose()
    json.dumps(data, allow_nan=False)
    assert set(data) == {"machines", "benchmarks", "compare", "peaks", "accuracy"}
    fingerprint = document(sha("x"))["machine"]["fingerprint"]
    assert data["machines"] == [{"fingerprint": fingerprint, "device": "cpu",
                                 "cpu_model": "Synthetic CPU box", "cores": 16, "ram_gb": 64,
                                 "gpu_name": None}]
    assert data["peaks"] == {fingerprint: {"memory_gbps": 50.0,
                                           "tflops": {"float32": 1.5, "bfloat16": 3.0}}}
    assert len(data["benchmarks"]) == len(KEYS)
    for bench in data["benchmarks"]:
        assert set(bench) == {"key", "suite", "op", "params", "definition_hash", "machine",
                              "series", "steps"}
        assert bench["machine"] == fingerprint
        orders = [p["commit_order"] for p in bench["series"]]
        assert orders == sorted(orders) and len(orders) == 10
        for point in bench["series"]:
            assert set(point) == {"commit", "commit_order", "median_ns", "q1_ns", "q3_ns",
                                  "runs", "flops", "bytes", "tflops", "gbps"}
            assert point["runs"] == 3 and point["q1_ns"] <= point["median_ns"] <= point["q3_ns"]
            assert point["tflops"] == pytest.approx(point["flops"] / point["median_ns"] / 1e3)
    slow = next(b for b in data["benchmarks"] if b["key"] == SLOW_KEY)
    assert [(s["commit"], s["state"]) for s in slow["steps"]] == [(sha("h6"), "open")]
    assert set(slow["steps"][0]) == {"commit", "ratio", "q", "state", "reason"}
    assert all(not b["steps"] for b in data["benchmarks"] if b["key"] != SLOW_KEY)
    compare = data["compare"]
    assert (compare["base"], compare["head"], compare["machine"]) == (sha("h8"), sha("h9"),
                                                                       fingerprint)
    assert {row["key"] for row in compare["rows"]} == set(KEYS)
    assert set(compare["rows"][0]) == {"key", "base_median_ns", "head_median_ns", "ratio",
                                       "q", "verdict"}


def test_site_data_of_an_empty_database(db):
    engine = store.open_engine(db)
    assert site_data(engine) == {"machines": [], "benchmarks": [], "compare": None,
                                 "peaks": {}, "accuracy": []}
    engine.dispose()


def test_ack_needs_a_reason(db, tmp_path, capsys):
    _history(db, tmp_path, [1.0] * 6 + [1.1] * 4)
    assert dash(db, "history") == 0
    capsys.readouterr()
    assert dash(db, "ack", SLOW_KEY, "--reason", "  ") == 2
    assert "reason" in error_line(capsys)
    assert [r.state for r in _steps(db)] == ["open"]


def test_site_command_writes_the_site(db, tmp_path):
    pytest.importorskip("gnomon.dash.site")  # written alongside; runs once it is there
    _history(db, tmp_path, [1.0] * 6 + [1.1] * 4)
    out = tmp_path / "site"
    assert dash(db, "site", str(out)) == 0
    assert any(out.iterdir())
