"""A replica's own Prometheus metrics: which ones the control plane asks its agent to read, and
the values the agent reports.

An autoscaling policy may track a metric the workload itself exposes, e.g. vLLM's
``vllm:num_requests_waiting``. The server names it in the replica's desired allocation
(:class:`Scrape`: a declared port, a path, the metric names); the agent reads that endpoint
every few seconds (:mod:`hostagent.runtime.metrics`) and sends the latest value of each name in
its ``telemetry`` (:class:`ReplicaMetric`). Both fields are optional: an older agent ignores
``scrape`` and sends no values, and the policy then says the metric is not available; an older
server drops ``replica_metrics`` unread. A value is finite and bounded; ``None`` with an
``error`` says why the agent has none (the endpoint did not answer, the metric is absent): it is
never a made-up number.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from msgspec import Meta

from hostagent.protocol.bounds import MAX_ITEMS, Text, Timestamp
from hostagent.protocol.ports import PortName

METRIC_NAME_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$"
"""A Prometheus metric name (the exposition format's grammar), at most 200 characters."""
SCRAPE_PATH_PATTERN = r"^/[A-Za-z0-9._~/%:@!$&'()*+,;=?-]{0,199}$"
"""The path (and query) the agent requests: printable URL characters only, at most 200."""
MAX_SCRAPED_NAMES = 4
"""Metric names one replica is asked for."""
MAX_METRIC_VALUE = 1e15
"""A reported value's bound either side of zero (NaN and infinities are refused)."""

MetricName = Annotated[str, Meta(pattern=METRIC_NAME_PATTERN)]
ScrapePath = Annotated[str, Meta(pattern=SCRAPE_PATH_PATTERN)]
MetricValue = Annotated[float, Meta(ge=-MAX_METRIC_VALUE, le=MAX_METRIC_VALUE)]


class Scrape(TypedDict):
    """What to read of one replica: ``GET <path>`` on its declared port ``port`` (by name:
    the agent knows the replica's host port), and the metrics ``names`` to report."""

    port: PortName
    path: ScrapePath
    names: Annotated[list[MetricName], Meta(min_length=1, max_length=MAX_SCRAPED_NAMES)]


class ReplicaMetric(TypedDict):
    """The latest reading of one metric of one replica: ``value`` the sum of its samples (every
    label set) in the exposition read at ``ts``; ``None`` and ``error`` when there is none."""

    allocation_id: Annotated[int, Meta(ge=1, le=2**63 - 1)]
    name: MetricName
    value: MetricValue | None
    ts: Timestamp
    error: Text


ReplicaMetrics = Annotated[list[ReplicaMetric], Meta(max_length=MAX_ITEMS)]
