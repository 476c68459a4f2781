"""The gateway's meter (pure): rates from HAProxy's counters over a sliding window, a counter
that went backwards starting a new window, HAProxy's server status in the endpoint's words."""

from __future__ import annotations

from fleet.endpoints.haproxy.runtime import Counters
from fleet.endpoints.metering import Meter


def row(server: str = "r7", requests: int = 0, **extra) -> Counters:
    values = {
        "backend": "ep_3",
        "server": server,
        "in_flight": 0,
        "queued": 0,
        "requests": requests,
        "errors_5xx": 0,
        "response_ms": 0,
        "status": "UP",
        **extra,
    }
    return Counters(**values)


def test_a_rate_needs_two_readings_and_slides_over_its_window():
    meter = Meter(window_s=5.0)
    (first,) = meter.observe([row(requests=100)], now=0.0)
    assert first.slot == 3 and first.allocation_id == 7 and first.requests_per_s is None
    assert first.response_ms is not None  # 100 requests served: HAProxy's average counts
    (second,) = meter.observe([row(requests=110, in_flight=3, response_ms=42)], now=1.0)
    assert second.requests_per_s == 10.0 and second.in_flight == 3 and second.response_ms == 42
    for t in range(2, 9):
        (sample,) = meter.observe([row(requests=110 + 20 * (t - 1))], now=float(t))
    assert sample.requests_per_s == 20.0  # the first second's 10/s has left the window


def test_a_counter_that_goes_back_starts_again_and_nothing_is_invented():
    meter = Meter()
    meter.observe([row(requests=500)], now=0.0)
    (after,) = meter.observe([row(requests=3)], now=1.0)  # deleted and added again
    assert after.requests_per_s is None
    (next_,) = meter.observe([row(requests=8)], now=2.0)
    assert next_.requests_per_s == 5.0


def test_states_backends_and_servers_not_of_an_endpoint():
    meter = Meter()
    samples = meter.observe(
        [
            row(server="r1", status="DRAIN"),
            row(server="r2", status="MAINT"),
            row(server="r3", status="DOWN 1/2"),
            row(server="r4", status="no check"),
            row(server="BACKEND", queued=5, status="UP"),
            row(server="stray"),  # not a name the gateway gives
            Counters("stats", "BACKEND", 0, 0, 0, 0, 0, "UP"),  # not an endpoint's backend
        ],
        now=0.0,
    )
    states = {s.allocation_id: s.state for s in samples}
    assert states == {1: "draining", 2: "maint", 3: "down", 4: "ready", 0: "ready"}
    assert next(s for s in samples if s.allocation_id == 0).queued == 5
    assert all(s.response_ms is None for s in samples)  # no request yet: no average


def test_a_server_gone_is_forgotten():
    meter = Meter()
    meter.observe([row(server="r1", requests=5), row(server="r2", requests=5)], now=0.0)
    meter.observe([row(server="r2", requests=9)], now=1.0)
    (back,) = meter.observe([row(server="r1", requests=50)], now=2.0)
    assert back.requests_per_s is None  # a new window, not (50 - 5) / 2


def test_a_server_name_of_non_ascii_digits_names_no_copy():
    """HAProxy's answer is the gateway's to trust only so far: ``r²`` is no allocation (int()
    refused it, and the reading failed)."""
    from fleet.endpoints.metering import _allocation_of

    assert _allocation_of("r12") == 12
    assert _allocation_of("r²") is None and _allocation_of("r") is None
