"""`gnomon sweep`'s executors: the wall time of one grid under ``--jobs 1``, ``--jobs 2`` and a
local Ray cluster, against the ideal ``points x (one point's time) / jobs``.

The grid is the issue's: gpt-oss-120b at 1k in / 1k out, 500 requests per point, 3 hardware x
4 concurrencies x 2 tp x 2 token budgets = 48 points. extra_info holds the wall time, the mean
point time (measured inside the points, the `wall_seconds` of each record), the ratio of the
wall time to the ideal (goal: at most 1.15) and, for Ray, the overhead per point against the
process pool. Under ``--benchmark-disable`` (CI) a 4-point grid of 20 requests runs once per
executor, as a smoke test (Ray only where it is installed).
"""

import os

import pytest

from conftest import note, record
from gnomon.predict.sweep import SweepSpec, run_sweep

FULL_GRID = {"hardware": ["H100 SXM", "H200", "MI300X"], "tp": [1, 2],
             "concurrency": [16, 64, 128, 256], "max_num_batched_tokens": [2048, 8192]}
SMOKE_GRID = {"hardware": ["H100 SXM"], "tp": [1, 2], "concurrency": [16, 64]}


def _spec(smoke: bool) -> SweepSpec:
    base = {"model": "gpt-oss-120b", "workload": "random", "input_len": "1024",
            "output_len": "1024", "rate": "inf", "num_requests": 20 if smoke else 500,
            "seed": 0}
    return SweepSpec(base, SMOKE_GRID if smoke else FULL_GRID)


@pytest.mark.parametrize("executor", ["jobs1", "jobs2", "ray"])
def test_sweep_wall_time(benchmark, request, executor):
    smoke = bool(request.config.getoption("benchmark_disable"))
    if executor == "ray":
        pytest.importorskip("ray", reason="gnomon[ray] is not installed")
    spec = _spec(smoke)
    jobs = 1 if executor == "jobs1" else 2
    runs = []

    def sweep_once():
        if executor == "ray":
            import ray

            ray.init(num_cpus=2, object_store_memory=200 * 1024 * 1024,
                     include_dashboard=False, log_to_driver=False)
            try:
                runs.append(run_sweep(spec, use_ray=True))
            finally:
                ray.shutdown()
        else:
            runs.append(run_sweep(spec, jobs=jobs))

    benchmark.pedantic(sweep_once, rounds=1, iterations=1)
    record("sweep", executor, benchmark)
    doc = runs[-1]
    assert all(r["status"] == "complete" for r in doc["points"])
    if benchmark.stats is None:
        return
    wall = benchmark.stats.stats.median
    point = sum(r["wall_seconds"] for r in doc["points"]) / len(doc["points"])
    ideal = len(doc["points"]) * point / jobs
    benchmark.extra_info.update(points=len(doc["points"]), wall_s=wall, mean_point_s=point,
                                wall_over_ideal=wall / ideal, cpus=os.cpu_count())
    note(f"sweep {executor}: {len(doc['points'])} points in {wall:.1f} s, mean point "
         f"{point:.2f} s, wall / ideal {wall / ideal:.2f}")
