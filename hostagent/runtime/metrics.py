"""Reading the replicas' own Prometheus metrics: a bounded scrape, a small parser of the text
exposition format, and the thread that keeps the latest readings for the telemetry.

The control plane names what to read in a desired allocation's ``scrape``
(:class:`hostagent.protocol.Scrape`). Every :data:`SCRAPE_INTERVAL_S` the agent reads each
running replica's endpoint, where its health check would go
(:func:`hostagent.runtime.health.check_target`), and keeps, per metric name, the sum of its
samples over every label set. A workload's endpoint is the tenant's: it is read with a
deadline, at most :data:`MAX_BODY_BYTES` and :data:`MAX_SERIES` sample lines, and a value that is
not a finite number within the protocol's bounds is refused, never reported. A reading that
fails reports ``None`` and why; one older than :data:`STALE_AFTER_S` is not reported at all.

Only the standard library: the agent installs without ``prometheus_client``.
"""

from __future__ import annotations

import http.client
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hostagent.protocol import MAX_ITEMS, MAX_METRIC_VALUE, ReplicaMetric, clip

logger = logging.getLogger(__name__)

SCRAPE_INTERVAL_S = 5.0
"""How often each replica's endpoint is read (Prometheus' own default is 15 s to 1 min)."""
SCRAPE_TIMEOUT_S = 2.0
"""The whole of one read (connect, request, body), whatever the workload does."""
MAX_BODY_BYTES = 1 << 20
"""The most of an exposition the agent reads (vLLM's is about 30 KiB)."""
MAX_SERIES = 20_000
"""Sample lines parsed per exposition; past it the reading fails."""
STALE_AFTER_S = 3 * SCRAPE_INTERVAL_S
"""A reading older than this is not reported (its replica stopped being scraped)."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class ExpositionError(ValueError):
    """The exposition cannot be read (too large, too many series)."""


@dataclass(frozen=True)
class Reading:
    """One metric of one scrape: ``value`` or, when there is none, ``error``."""

    value: float | None
    error: str = ""


def _labels_end(line: str, start: int) -> int:
    """The index just past the ``}`` closing the label set opened at ``start`` (quoted values
    may hold ``}``, spaces and escaped quotes); -1 when it is not closed."""
    quoted = False
    i = start + 1
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "}":
            return i + 1
        i += 1
    return -1


def _sample(line: str) -> tuple[str, str] | None:
    """``(metric name, value text)`` of a sample line; ``None`` for a line that is not one."""
    match = _NAME.match(line)
    if match is None:
        return None
    end = match.end()
    if end < len(line) and line[end] == "{":
        end = _labels_end(line, end)
        if end < 0:
            return None
    fields = line[end:].split()
    if not fields or len(fields) > 2:  # a value, and an optional timestamp
        return None
    return match.group(), fields[0]


def parse_exposition(
    text: str, names: Iterable[str], *, max_series: int = MAX_SERIES
) -> dict[str, Reading]:
    """The reading of each of ``names`` in a Prometheus text exposition (format 0.0.4, and the
    OpenMetrics text that extends it): the sum of the metric's samples over its label sets.

    A name with no sample reads ``None`` ("not in the exposition"); a sample that is not a
    finite number (``NaN``, ``+Inf``, garbage) makes that name read ``None`` with the reason,
    as does a sum beyond :data:`~hostagent.protocol.MAX_METRIC_VALUE`. Comments (``# HELP``,
    ``# TYPE``, ``# EOF``), blank and malformed lines are skipped.

    Raises:
        ExpositionError: more than ``max_series`` sample lines.
    """
    wanted = set(names)
    sums: dict[str, float] = {}
    bad: dict[str, str] = {}
    series = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        series += 1
        if series > max_series:
            raise ExpositionError(f"more than {max_series} series")
        sample = _sample(line)
        if sample is None or sample[0] not in wanted:
            continue
        name, text_value = sample
        try:
            value = float(text_value)
        except ValueError:
            bad[name] = f"the value {clip(text_value, 40)!r} is not a number"
            continue
        if not math.isfinite(value):
            bad[name] = f"the value is {text_value}"
            continue
        sums[name] = sums.get(name, 0.0) + value
    readings: dict[str, Reading] = {}
    for name in wanted:
        if name in bad:
            readings[name] = Reading(None, bad[name])
        elif name not in sums:
            readings[name] = Reading(None, "the metric is not in the exposition")
        elif not abs(sums[name]) <= MAX_METRIC_VALUE:
            readings[name] = Reading(None, "the value is out of bounds")
        else:
            readings[name] = Reading(sums[name])
    return readings


def fetch_exposition(
    host: str,
    port: int,
    path: str,
    *,
    timeout_s: float = SCRAPE_TIMEOUT_S,
    max_bytes: int = MAX_BODY_BYTES,
) -> str:
    """``GET http://<host>:<port><path>``'s body, read within ``timeout_s`` in all and at most
    ``max_bytes`` long.

    Raises:
        ExpositionError: the endpoint failed, answered other than 200, too slowly or too much.
    """
    deadline = time.monotonic() + timeout_s
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request(
            "GET",
            path,
            headers={"User-Agent": "fleet-agent", "Accept": "text/plain;version=0.0.4"},
        )
        response = connection.getresponse()
        if response.status != 200:
            raise ExpositionError(f"GET :{port}{path} answered {response.status}")
        body = bytearray()
        while True:
            if time.monotonic() > deadline:
                raise ExpositionError(f"GET :{port}{path} took more than {timeout_s:g} s")
            chunk = response.read1(65536)
            if not chunk:
                break
            body += chunk
            if len(body) > max_bytes:
                raise ExpositionError(f"GET :{port}{path} sent more than {max_bytes} bytes")
    except (OSError, http.client.HTTPException) as exc:
        raise ExpositionError(clip(f"GET :{port}{path}: {type(exc).__name__}: {exc}")) from None
    finally:
        connection.close()
    return body.decode("utf-8", "replace")


@dataclass(frozen=True)
class ScrapeTarget:
    """One running replica to read: where (``address`` = ``(host, port)``), or why nowhere
    (``problem``), and which metrics."""

    allocation_id: int
    names: tuple[str, ...]
    path: str
    address: tuple[str, int] | None
    problem: str = ""


def scrape(
    target: ScrapeTarget, fetch: Callable[..., str] = fetch_exposition
) -> dict[str, Reading]:
    """Read one target: a reading per metric name, each with the error when there is none."""
    if target.address is None:
        return {name: Reading(None, target.problem) for name in target.names}
    try:
        text = fetch(*target.address, target.path)
        return parse_exposition(text, target.names)
    except ExpositionError as exc:
        return {name: Reading(None, clip(str(exc))) for name in target.names}


class MetricsScraper:
    """Reads every target (``targets``: the supervisor's running replicas that have a
    ``scrape``) every ``interval_s`` on a thread of its own, so a slow endpoint never holds the
    telemetry tick; :meth:`readings` gives the latest, for the next ``telemetry`` message."""

    def __init__(
        self,
        targets: Callable[[], list[ScrapeTarget]],
        *,
        interval_s: float = SCRAPE_INTERVAL_S,
        fetch: Callable[..., str] = fetch_exposition,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.targets = targets
        self.interval_s = max(1.0, interval_s)
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[tuple[int, str], tuple[float, Reading]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fleet-metrics", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrape_once()
            except Exception:  # a bug reading one round must not end the readings
                logger.exception("reading the replicas' metrics failed")
            self._stop.wait(self.interval_s)

    def scrape_once(self) -> None:
        """Read every target once (in this thread), replacing what was known of them."""
        targets = self.targets()[:MAX_ITEMS]
        fresh: dict[tuple[int, str], tuple[float, Reading]] = {}
        for target in targets:
            readings = scrape(target, self._fetch)
            now = self._clock()
            for name, reading in readings.items():
                fresh[(target.allocation_id, name)] = (now, reading)
        with self._lock:
            self._latest = fresh

    def readings(self) -> list[ReplicaMetric]:
        """The latest reading of each replica's metrics, none older than
        :data:`STALE_AFTER_S` (scaled to the interval)."""
        oldest = self._clock() - max(STALE_AFTER_S, 3 * self.interval_s)
        with self._lock:
            items = sorted(self._latest.items())
        return [
            ReplicaMetric(
                allocation_id=allocation_id,
                name=name,
                value=reading.value,
                ts=ts,
                error=clip(reading.error),
            )
            for (allocation_id, name), (ts, reading) in items
            if ts >= oldest
        ][:MAX_ITEMS]
