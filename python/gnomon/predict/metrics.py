"""Serving metrics of one `RunTrace`: latency distributions, throughput, goodput, KV usage,
prefix-cache hits, preemptions and step mix.

Every aggregate comes with its decomposition: TTFT with queueing and prefill (per request,
``ttft = queueing + prefill``), goodput with how many requests missed each SLO, step time with
its per-family breakdown and whatever no family claims (``unattributed_s``).

Definitions (times on the run's clock, seconds):

- arrival is the client's send (the trace's ``sent``); the request reaches the scheduler
  ``serving.ingress(prompt)`` later, or when the one sent before it did, and the client sees a
  token ``response_s`` after the step that made it ends: the run's `ServingPath` (none by
  default).
- queueing = first_scheduled - reaching the scheduler (with the step an engine that schedules
  ahead had already chosen); prefill = first_token - first_scheduled (both on the engine's
  clock); serving = the rest of the TTFT (ingress and the response path); ttft = serving +
  queueing + prefill, the client's first token - arrival; e2e = the client's last token -
  arrival.
- tpot = (finish - first_token) / (output_tokens - 1), per request; None for one-token outputs
  (left out of the TPOT summary).
- itl: the gaps between consecutive output tokens of a request, pooled over all requests.
- a request is *good* when ttft <= slo.ttft_s and (tpot is None or tpot <= slo.tpot_s).
- throughput: output and total (prompt + output) tokens over the duration, also per GPU (over
  ``num_gpus``); per user, 1 / mean TPOT (how fast one user sees tokens, as sweeps plot it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import numpy as np

MAX_SERIES_POINTS = 500


@dataclass(frozen=True)
class SLO:
    """Latency targets for goodput: time to first token and time per output token."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def __post_init__(self):
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: expected a positive number of seconds, got {value!r}")


@dataclass(frozen=True)
class Summary:
    """Distribution of a list of values; every field but `count` is None for an empty list.
    Percentiles are numpy's, linear interpolation."""

    count: int
    mean: Optional[float]
    p50: Optional[float]
    p90: Optional[float]
    p99: Optional[float]
    min: Optional[float]
    max: Optional[float]

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(values) -> Summary:
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        return Summary(0, None, None, None, None, None, None)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return Summary(int(a.size), float(a.mean()), float(p50), float(p90), float(p99),
                   float(a.min()), float(a.max()))


class _PerRequest:
    """The per-request times as arrays (workload order) and each request's token gaps."""

    def __init__(self, trace):
        outputs = trace.outputs
        n = len(outputs)
        if n == 0:
            raise ValueError("trace: no requests")
        self.ids = [o.request_id for o in outputs]
        rows = np.empty((n, 4))
        self.prompt = np.empty(n, dtype=np.int64)
        self.out = np.empty(n, dtype=np.int64)
        token_times = trace.token_times
        made: List[np.ndarray] = []  # each request's token times on the engine's clock
        for i, o in enumerate(outputs):
            m = o.metrics
            times = (m.arrival_time, m.first_scheduled_time, m.first_token_time, m.finish_time)
            if not o.finished or any(t is None for t in times):
                missing = [name for name, t in zip(
                    ("first_scheduled_time", "first_token_time", "finish_time"), times[1:])
                    if t is None]
                raise ValueError(f"request {o.request_id!r} did not finish"
                                 + (f" (no {', '.join(missing)})" if missing else ""))
            rows[i] = times
            k = len(o.outputs[0].token_ids)
            if k < 1:
                raise ValueError(f"request {o.request_id!r} finished with no output tokens")
            tt = np.asarray(token_times.get(o.request_id, ()), dtype=np.float64)
            if tt.size != k:
                raise ValueError(f"request {o.request_id!r}: token_times holds {tt.size} times "
                                 f"for {k} output tokens")
            made.append(tt)
            self.prompt[i] = len(o.prompt_token_ids)
            self.out[i] = k
        entered, sched, first, finish = rows.T
        path = trace.serving

        def seen(t):  # when the client sees what the step ending at t made
            return t + path.response_s

        sent = getattr(trace, "sent", None) or {}
        self.arrival = np.array([sent.get(i, t) for i, t in zip(self.ids, entered)])
        first_seen, self.finish = seen(first), seen(finish)
        # every token's time as the client sees it, in one pass, then split per request
        ends_at = np.cumsum([tt.size for tt in made])[:-1]
        self.gaps: List[np.ndarray] = [np.diff(t) for t in np.split(
            seen(np.concatenate(made)), ends_at)]
        self.queueing = sched - entered
        self.prefill = first - sched
        self.ttft = first_seen - self.arrival
        self.serving = self.ttft - self.queueing - self.prefill
        self.e2e = self.finish - self.arrival
        with np.errstate(divide="ignore", invalid="ignore"):
            self.tpot = np.where(self.out > 1, (self.finish - first_seen) / (self.out - 1),
                                 np.nan)


def _opt(x: float) -> Optional[float]:
    return None if math.isnan(x) else float(x)


def request_metrics(trace) -> List[dict]:
    """One dict per request, in workload order (see the module docstring for definitions)."""
    r = _PerRequest(trace)
    return [{"request_id": r.ids[i], "arrival": float(r.arrival[i]),
             "prompt_tokens": int(r.prompt[i]), "output_tokens": int(r.out[i]),
             "queueing_s": float(r.queueing[i]), "prefill_s": float(r.prefill[i]),
             "serving_s": float(r.serving[i]), "ttft_s": float(r.ttft[i]),
             "tpot_s": _opt(r.tpot[i]),
             "itl_s": r.gaps[i].tolist(), "e2e_s": float(r.e2e[i])}
            for i in range(len(r.ids))]


def _rate(count: float, seconds: float) -> Optional[float]:
    return float(count / seconds) if seconds > 0 else None


def _kv(trace) -> dict:
    samples = np.asarray(trace.kv_usage, dtype=np.float64).reshape(-1, 2)
    out = {"num_blocks": int(trace.num_kv_blocks), "samples": int(len(samples)),
           "peak_usage": None, "mean_usage": None,
           "mean_usage_basis": "time-weighted: each sample (taken after a step) holds until "
                               "the next sample",
           "series": [],
           "series_basis": f"at most {MAX_SERIES_POINTS} points: the sample of highest usage "
                           "in each run of consecutive samples"}
    windows = trace.kv_windows
    out["groups"] = [{"window": w, "peak_blocks": None, "peak_usage": None, "mean_usage": None}
                     for w in windows]
    out["groups_basis"] = ("per KV-cache group (window None: full attention), the blocks its "
                           "tables hold, as a share of the one pool; the groups sum to the "
                           "whole")
    if len(samples) == 0:
        return out
    t, u = samples[:, 0], samples[:, 1]
    weights = np.diff(t)
    total = float(weights.sum())

    def mean(values) -> float:
        return float((values[:-1] * weights).sum() / total) if total > 0 else float(values.mean())

    out["peak_usage"] = float(u.max())
    out["mean_usage"] = mean(u)
    blocks = np.asarray(trace.kv_group_blocks, dtype=np.float64).reshape(len(samples),
                                                                         len(windows))
    for g, group in enumerate(out["groups"]):
        group.update(peak_blocks=int(blocks[:, g].max()),
                     peak_usage=float(blocks[:, g].max() / trace.num_kv_blocks),
                     mean_usage=mean(blocks[:, g] / trace.num_kv_blocks))
    if len(samples) > MAX_SERIES_POINTS:
        edges = np.linspace(0, len(samples), MAX_SERIES_POINTS + 1).astype(np.int64)
        picks = [lo + int(np.argmax(u[lo:hi])) for lo, hi in zip(edges[:-1], edges[1:])]
        samples = samples[picks]
    out["series"] = samples.tolist()
    return out


def _steps(trace) -> dict:
    steps = trace.steps
    n = len(steps)
    counts = np.empty((n, 4))
    breakdown: Dict[str, float] = {}
    for i, s in enumerate(steps):
        counts[i] = (s.num_prefill_tokens, s.num_decode_tokens, s.num_seqs, s.seconds)
        for key, value in s.breakdown.items():
            breakdown[key] = breakdown.get(key, 0.0) + float(value)
    prefill, decode, seqs, seconds = counts.T
    busy = float(seconds.sum())
    return {"count": n,
            "prefill": int(np.count_nonzero(decode == 0)),
            "decode": int(np.count_nonzero((prefill == 0) & (decode > 0))),
            "mixed": int(np.count_nonzero((prefill > 0) & (decode > 0))),
            "mean_batch_tokens": float((prefill + decode).mean()) if n else None,
            "mean_batch_seqs": float(seqs.mean()) if n else None,
            "busy_s": busy,
            "breakdown_s": dict(sorted(breakdown.items())),
            "unattributed_s": busy - sum(breakdown.values())}


def compute_metrics(trace, slo: SLO = SLO(), num_gpus: int = 1) -> dict:
    """The JSON-ready metrics of one run on `num_gpus` GPUs; see the module docstring for the
    definitions."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
        raise ValueError(f"num_gpus: expected a positive int, got {num_gpus!r}")
    r = _PerRequest(trace)
    n = len(r.ids)
    duration = float(r.finish.max() - r.arrival.min())
    tpot_known = ~np.isnan(r.tpot)
    ttft_ok = r.ttft <= slo.ttft_s
    tpot_ok = ~tpot_known | (r.tpot <= slo.tpot_s)
    good = int(np.count_nonzero(ttft_ok & tpot_ok))
    out_tokens = int(r.out.sum())
    itl = np.concatenate(r.gaps) if r.gaps else np.empty(0)
    queried, hit = int(trace.prefix_queried_tokens), int(trace.prefix_hit_tokens)
    total_tokens = out_tokens + int(r.prompt.sum())
    tpot = summarize(r.tpot[tpot_known])
    return {
        "requests": n,
        "duration_s": duration,
        "ttft": summarize(r.ttft).as_dict(),
        "queueing": summarize(r.queueing).as_dict(),
        "prefill": summarize(r.prefill).as_dict(),
        "serving": summarize(r.serving).as_dict(),
        "tpot": tpot.as_dict(),
        "itl": summarize(itl).as_dict(),
        "e2e": summarize(r.e2e).as_dict(),
        "throughput": {"requests_per_s": _rate(n, duration),
                       "output_tokens_per_s": _rate(out_tokens, duration),
                       "total_tokens_per_s": _rate(total_tokens, duration),
                       "num_gpus": num_gpus,
                       "output_tokens_per_s_per_gpu": _rate(out_tokens / num_gpus, duration),
                       "total_tokens_per_s_per_gpu": _rate(total_tokens / num_gpus, duration),
                       "output_tokens_per_s_per_user": (1.0 / tpot.mean if tpot.mean else None),
                       "prompt_tokens": int(r.prompt.sum()), "output_tokens": out_tokens},
        "goodput": {"slo": {"ttft_s": float(slo.ttft_s), "tpot_s": float(slo.tpot_s)},
                    "good_requests": good,
                    "ttft_violations": int(np.count_nonzero(~ttft_ok)),
                    "tpot_violations": int(np.count_nonzero(~tpot_ok)),
                    "requests_per_s": _rate(good, duration),
                    "fraction": good / n},
        "kv": _kv(trace),
        "prefix_cache": {"queried_tokens": queried, "hit_tokens": hit,
                         "hit_rate": hit / queried if queried else None},
        "preemptions": int(trace.num_preemptions),
        "steps": _steps(trace),
        "per_request": {"request_id": [str(i) for i in r.ids],
                        "queueing_s": r.queueing.tolist(), "prefill_s": r.prefill.tolist(),
                        "serving_s": r.serving.tolist(),
                        "ttft_s": r.ttft.tolist(),
                        "tpot_s": [_opt(x) for x in r.tpot.tolist()],
                        "e2e_s": r.e2e.tolist()},
    }
