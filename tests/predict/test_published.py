"""`gnomon simulate` against published serving measurements on real GPUs, through `gnomon
accuracy --points published` (the points live in ``gnomon/predict/data/published.jsonl``, in
gnomon's measured-points schema, each with its source).

Each point sets only what its source states, plus the engine's defaults: ``vllm-0.10`` (vLLM
0.10's scheduler defaults, async scheduling off) or ``vllm`` (async scheduling on, as the
sources' ``--async-scheduling`` runs). The ratio predicted / published of each metric must stay
in the band this build reaches (`BANDS`: the closing note of issue 35's ratios, with a margin of
about a quarter; the four tp-1 H100 points' bands moved when the H100's memory became the
81,559 MiB it reports, not 80e9 bytes: vLLM reserves more beside gpt-oss-120b's weights on an H100
than gnomon counts, and 80e9 had hidden part of that), so that a change that moves a point is
seen; the goal bands of the earlier issue (0.8-1.25 for throughput, 0.75-1.33 for latencies) are
not asserted, since several points miss them.

Not moved: AMD's 1,500-prompt Llama-3.1-70B FP8 throughput on 8x MI300X (vLLM 0.10.1), which
does not say whether it counts output or total tokens, and ran with ``--max-num-seqs 1500``, a
setting the schema has no field for.
"""

from __future__ import annotations

import pytest

from gnomon.predict import measured, scorecard

# id -> {metric: (low, high)} of predicted / published
BANDS = {
    "gpustack-gpt-oss-tp1-sharegpt-c4": {"ttft": (0.85, 1.5), "tpot": (0.65, 1.05),
                                         "output_tokens_per_s": (0.8, 1.25)},
    "gpustack-gpt-oss-tp2-sharegpt-c4-async": {"ttft": (1.0, 1.7), "tpot": (0.7, 1.1),
                                               "output_tokens_per_s": (0.7, 1.15)},
    "gpustack-gpt-oss-tp1-sharegpt-1000": {"ttft": (0.1, 0.17), "tpot": (0.8, 1.35),
                                           "total_tokens_per_s": (1.5, 2.5)},
    "gpustack-gpt-oss-tp1-random-2000-100": {"ttft": (0.33, 0.55), "tpot": (1.3, 2.2),
                                             "total_tokens_per_s": (1.55, 2.6)},
    "gpustack-gpt-oss-tp2-random-2000-100-async": {"ttft": (0.35, 0.6), "tpot": (0.4, 0.7),
                                                   "total_tokens_per_s": (1.5, 2.5)},
    "gpustack-gpt-oss-tp1-random-4000-200": {"ttft": (0.45, 0.75), "tpot": (1.2, 2.0),
                                             "total_tokens_per_s": (1.2, 2.05)},
    "gpustack-gpt-oss-tp1-random-32000-100": {"ttft": (0.45, 0.75), "tpot": (2.5, 4.2),
                                              "total_tokens_per_s": (1.25, 2.1)},
    "amd-llama-70b-fp8-tp8-batch1": {"tpot": (0.9, 1.1)},
}


@pytest.fixture(scope="module")
def doc():
    return scorecard.run(measured.load_points(measured.PUBLISHED_FILE), jobs=2,
                         source="published points")


def test_every_published_point_has_a_band():
    assert {p.id for p in measured.load_points(measured.PUBLISHED_FILE)} == set(BANDS)


@pytest.mark.parametrize("point_id", sorted(BANDS))
def test_published_point(doc, point_id):
    (row,) = [r for r in doc["rows"] if r["id"] == point_id]
    assert row["status"] == scorecard.ANSWERED, row.get("reason")
    measured_ratios = {k: v for k, v in row["ratio"].items() if v is not None}
    assert set(measured_ratios) == set(BANDS[point_id])
    print(f"{point_id}: " + ", ".join(f"{m} {r:.2f}" for m, r in measured_ratios.items())
          + f"; preemptions {row['preemptions']}")
    for metric, ratio in measured_ratios.items():
        lo, hi = BANDS[point_id][metric]
        assert lo <= ratio <= hi, (f"{point_id}: {metric} predicted/published {ratio:.2f} left "
                                   f"the band [{lo}, {hi}]")
