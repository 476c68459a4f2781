"""Reading a replica's own Prometheus metrics (issue 24): the text exposition parsed by a small
parser that sums a metric's series and refuses NaN, infinities and garbage; the endpoint read
with a deadline and a size limit against a real HTTP server; and the scraper's latest readings,
which go stale rather than linger."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hostagent import protocol
from hostagent.runtime.metrics import (
    ExpositionError,
    MetricsScraper,
    Reading,
    ScrapeTarget,
    fetch_exposition,
    parse_exposition,
    scrape,
)

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="qwen-7b"} 3.0
vllm:num_requests_waiting{model_name="qwen-7b-lora",engine="1"} 4
# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="qwen-7b"} 12.0 1712345678000
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="qwen-7b"} 57
vllm:e2e_request_latency_seconds_sum{model_name="qwen-7b"} 12.5
queue_depth 2e1
# EOF
"""


def test_a_metric_is_the_sum_of_its_series_and_the_others_are_ignored():
    readings = parse_exposition(
        VLLM, ["vllm:num_requests_waiting", "vllm:num_requests_running", "queue_depth"]
    )
    assert readings == {
        "vllm:num_requests_waiting": Reading(7.0),
        "vllm:num_requests_running": Reading(12.0),  # a timestamp after the value
        "queue_depth": Reading(20.0),
    }


def test_a_label_value_may_hold_braces_spaces_and_escaped_quotes():
    text = 'jobs{path="/a}b c",note="say \\"hi\\" }"} 5\njobs{x="\\\\"} 1\n'
    assert parse_exposition(text, ["jobs"]) == {"jobs": Reading(6.0)}


def test_an_absent_metric_reads_none_with_the_reason():
    (reading,) = parse_exposition(VLLM, ["vllm:gpu_cache_usage_perc"]).values()
    assert reading.value is None and "not in the exposition" in reading.error


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "twelve", "0x10"])
def test_a_value_that_is_not_a_finite_number_is_never_reported(value):
    text = f'waiting 3\nwaiting{{a="b"}} {value}\n'
    (reading,) = parse_exposition(text, ["waiting"]).values()
    assert reading.value is None and reading.error


def test_a_sum_beyond_the_protocols_bound_is_refused():
    text = 'huge 9e14\nhuge{a="1"} 9e14\n'
    (reading,) = parse_exposition(text, ["huge"]).values()
    assert reading.value is None and "out of bounds" in reading.error


def test_malformed_lines_are_skipped_not_fatal():
    text = 'waiting{a="unclosed 3\n{}\n  \nwaiting 1 2 3 4\n9bad 1\nwaiting 2\n'
    assert parse_exposition(text, ["waiting"]) == {"waiting": Reading(2.0)}


def test_more_series_than_the_bound_fail_the_reading():
    text = "".join(f'm{{i="{i}"}} 1\n' for i in range(101))
    with pytest.raises(ExpositionError, match="more than 100 series"):
        parse_exposition(text, ["m"], max_series=100)


class _Exporter(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200
    delay_s = 0.0

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        if self.delay_s:  # a slow exporter: the head, then the body in drips
            for byte in self.body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(self.delay_s)
        else:
            self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[tuple[int, type[_Exporter]]]:
    handler = type("Handler", (_Exporter,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def test_an_endpoint_is_read_over_http(exporter):
    port, handler = exporter
    handler.body = VLLM.encode()
    assert fetch_exposition("127.0.0.1", port, "/metrics") == VLLM


def test_an_endpoint_that_sends_too_much_too_slowly_or_fails_is_cut_off(exporter):
    port, handler = exporter
    handler.body = b"x" * 5000
    with pytest.raises(ExpositionError, match="more than 1000 bytes"):
        fetch_exposition("127.0.0.1", port, "/metrics", max_bytes=1000)
    handler.body, handler.delay_s = b"waiting 1\n" * 50, 0.01
    started = time.monotonic()
    with pytest.raises(ExpositionError, match="took more than"):
        fetch_exposition("127.0.0.1", port, "/metrics", timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    handler.delay_s, handler.status = 0.0, 500
    with pytest.raises(ExpositionError, match="answered 500"):
        fetch_exposition("127.0.0.1", port, "/metrics")


def test_an_endpoint_that_does_not_answer_reads_none_with_the_reason():
    target = ScrapeTarget(7, ("waiting",), "/metrics", ("127.0.0.1", 1))
    (reading,) = scrape(target).values()
    assert reading.value is None and "GET :1/metrics" in reading.error
    nowhere = ScrapeTarget(7, ("waiting",), "/metrics", None, "no host port for port 9100")
    assert scrape(nowhere) == {"waiting": Reading(None, "no host port for port 9100")}


def test_the_scraper_reports_valid_readings_that_go_stale():
    clock = [1000.0]
    targets = [
        ScrapeTarget(3, ("vllm:num_requests_waiting",), "/metrics", ("10.0.0.1", 9100)),
        ScrapeTarget(4, ("vllm:num_requests_waiting",), "/metrics", None, "not running"),
    ]
    scraper = MetricsScraper(
        lambda: targets, interval_s=5.0, fetch=lambda *_: VLLM, clock=lambda: clock[0]
    )
    assert scraper.readings() == []
    scraper.scrape_once()
    readings = scraper.readings()
    assert [(r["allocation_id"], r["value"], r["error"]) for r in readings] == [
        (3, 7.0, ""),
        (4, None, "not running"),
    ]
    telemetry = {"type": "telemetry", "ts": clock[0], "gpus": [], "replica_metrics": readings}
    assert protocol.validate_message(telemetry)["replica_metrics"] == readings  # type: ignore[typeddict-item]
    clock[0] += 16.0  # three intervals and more without a new reading
    assert scraper.readings() == []
