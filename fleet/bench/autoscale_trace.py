"""What ``bench_autoscale`` replays and how many replicas the static modes hold (pure).

The traces are Microsoft's Azure LLM inference traces (2023, CC-BY 4.0, published with the
Splitwise paper: Patel et al., *Splitwise: Efficient Generative LLM Inference Using Phase
Splitting*, ISCA 2024): one row per request of a production conversation (``conv``, about an
hour, 19 k requests) or coding (``code``, 8.8 k requests in bursts) service.

A request's service time is the test workload's (:mod:`fleet.bench.token_server`): 1 ms per 10
tokens, context and generated together. The trace is compressed in time (``factor`` = its span
over the replay's seconds); service times are not, so the load a replica sees is the trace's
load times ``factor``. The **load** of a window is the service time of the requests arriving in
it over the window's length: the requests in flight it needs on average. A *trace minute* is
``60 / factor`` seconds of replay.

* **static peak** holds ``ceil(peak minute's load / target)`` replicas, **static median**
  ``ceil(median minute's load / target)``, where ``target`` is the requests in flight per
  replica the autoscaler tracks: the three modes run their replicas equally busy on average.
* **sharpened bursts**: the trace's 30 s (trace time, ``30 / factor`` s of replay) with the most
  load get twice their arrival rate: each of their requests is sent a second time halfway to the
  next arrival. The static modes keep the sizes of the trace as it is: a burst is a surprise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from fleet.bench.replay import Arrival, load_trace
from fleet.bench.token_server import MAX_SERVICE_S, TOKENS_PER_MS

DATA = Path("/work/shared/data/azure-llm-inference-2023")
TRACES = {
    "conv": DATA / "AzureLLMInferenceTrace_conv.csv",
    "code": DATA / "AzureLLMInferenceTrace_code.csv",
}
SHARPEN_TRACE_S = 30.0


def service_s(arrival: Arrival) -> float:
    return min((arrival.context + arrival.generated) / TOKENS_PER_MS / 1000.0, MAX_SERVICE_S)


@dataclass(frozen=True)
class Trace:
    kind: str
    arrivals: list[Arrival]
    seconds: float  # the replay's length
    span_s: float  # the trace's own length
    sharpened: bool = False

    @property
    def factor(self) -> float:
        return self.span_s / self.seconds

    @property
    def minute_s(self) -> float:
        """One minute of the trace, in seconds of replay."""
        return 60.0 / self.factor


def _span(path: Path) -> float:
    """The trace's own length in seconds (first to last arrival; the rows are in order)."""
    first = last = ""
    with path.open(encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            if line.strip():
                last = line.split(",", 1)[0]
                first = first or last
    return (_stamp(last) - _stamp(first)).total_seconds()


def _stamp(text: str) -> datetime:
    return datetime.strptime(text.strip()[:26], "%Y-%m-%d %H:%M:%S.%f")


def load_replay(
    kind: str, seconds: float, path: Path | None = None, minutes: float | None = None
) -> Trace:
    """The trace compressed into ``seconds``; with ``minutes``, only its first ``minutes``
    (a milder compression for a short replay)."""
    source = path or TRACES[kind]
    if minutes is None:
        return Trace(kind, load_trace(source, seconds), seconds, _span(source))
    span = _span(source)
    window_s = min(span, minutes * 60.0)
    real = load_trace(source, span)  # arrival times in the trace's own seconds
    scale = seconds / window_s
    kept = [replace(a, at_s=a.at_s * scale) for a in real if a.at_s <= window_s]
    return Trace(kind, kept, seconds, window_s)


def mean_service_s(trace: Trace) -> float:
    """The mean service time of the trace's requests on the test workload."""
    return sum(service_s(a) for a in trace.arrivals) / max(1, len(trace.arrivals))


def window_loads(arrivals: Sequence[Arrival], window_s: float, seconds: float) -> list[float]:
    """The load (mean requests in flight needed) of each ``window_s`` of the replay."""
    count = max(1, math.ceil(seconds / window_s - 1e-9))
    work = [0.0] * count
    for arrival in arrivals:
        work[min(count - 1, int(arrival.at_s // window_s))] += service_s(arrival)
    return [w / window_s for w in work]


def static_sizes(trace: Trace, target: float) -> dict[str, int]:
    """Replicas of the static modes: the peak and the median trace minute at ``target``."""
    loads = window_loads(trace.arrivals, trace.minute_s, trace.seconds)
    return {
        "static_peak": max(1, math.ceil(max(loads) / target - 1e-9)),
        "static_median": max(1, math.ceil(statistics.median(loads) / target - 1e-9)),
    }


def first_minute_replicas(trace: Trace, target: float) -> int:
    loads = window_loads(trace.arrivals, trace.minute_s, trace.seconds)
    return max(1, math.ceil(loads[0] / target - 1e-9))


def sharpened(trace: Trace, trace_s: float = SHARPEN_TRACE_S) -> tuple[Trace, float]:
    """The trace with its busiest ``trace_s`` seconds (trace time, by load) at twice the arrival
    rate; also where that window starts (s of replay)."""
    arrivals = trace.arrivals
    window = trace_s / trace.factor
    step = window / 4.0
    work = window_loads(arrivals, step, trace.seconds)
    span = max(1, round(window / step))
    sums = [sum(work[i : i + span]) for i in range(max(1, len(work) - span + 1))]
    best = step * max(range(len(sums)), key=sums.__getitem__)
    extra = []
    for n, arrival in enumerate(arrivals):
        if best <= arrival.at_s < best + window:
            after = arrivals[n + 1].at_s if n + 1 < len(arrivals) else arrival.at_s
            extra.append(Arrival((arrival.at_s + after) / 2.0, arrival.context, arrival.generated))
    merged = sorted([*arrivals, *extra], key=lambda a: a.at_s)
    return Trace(trace.kind, merged, trace.seconds, trace.span_s, sharpened=True), best
