"""The protocol's replica metrics (issue 24): ``scrape`` in a desired allocation and
``replica_metrics`` in telemetry are optional (an older peer's messages still pass, and a
newer field is dropped by the projection), and bounded: NaN, infinities, values past the bound,
bad names, paths and duplicates are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hostagent import protocol


def _telemetry(**extra: Any) -> dict[str, Any]:
    return {"type": "telemetry", "ts": 1_700_000_000.0, "gpus": [], **extra}


def _reading(**over: Any) -> dict[str, Any]:
    return {
        "allocation_id": 12,
        "name": "vllm:num_requests_waiting",
        "value": 3.0,
        "ts": 1_700_000_000.0,
        "error": "",
        **over,
    }


def test_telemetry_without_readings_is_what_an_older_agent_sends():
    message = protocol.decode(json.dumps(_telemetry()))
    assert "replica_metrics" not in message


def test_telemetry_carries_readings_and_a_reading_may_have_no_value():
    readings = [_reading(), _reading(allocation_id=13, value=None, error="connection refused")]
    message = protocol.decode(json.dumps(_telemetry(replica_metrics=readings)))
    assert message["replica_metrics"] == readings  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "text",
    [
        '"value": NaN',
        '"value": Infinity',
        '"value": -Infinity',
        '"value": 1e400',
        '"value": 2e15',
        '"value": "3"',
        '"name": "9lives"',
        '"name": "a b"',
        '"allocation_id": 0',
        '"error": "' + "x" * 300 + '"',
    ],
)
def test_a_reading_out_of_its_bounds_is_refused(text):
    key = text.split(":", 1)[0].strip('"')
    raw = json.dumps(_telemetry(replica_metrics=[_reading(**{key: "__X__"})]))
    raw = raw.replace(f'"{key}": "__X__"', text)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(raw)


def test_two_readings_of_one_replica_and_name_are_refused():
    raw = json.dumps(_telemetry(replica_metrics=[_reading(), _reading(value=9.0)]))
    with pytest.raises(protocol.ProtocolError, match="duplicate replica metric"):
        protocol.decode(raw)


def _desired(**allocation_extra: Any) -> dict[str, Any]:
    allocation = {
        "key": "a1",
        "gpu_uuid": "GPU-1",
        "partition_key": None,
        "memory_mib": None,
        "max_compute_percent": None,
        **allocation_extra,
    }
    gpu = {
        "mode": "dedicated",
        "mig_enabled": False,
        "instances": [],
        "mps": {
            "enabled": False,
            "per_instance": False,
            "default_active_thread_percentage": None,
            "default_pinned_mem_limit_mib": None,
        },
        "allocations": [allocation],
    }
    return {"type": "desired_state", "generation": 3, "gpus": {"GPU-1": gpu}}


def test_a_desired_allocation_may_ask_for_a_scrape_and_an_older_one_does_not():
    scrape = {"port": "metrics", "path": "/metrics?format=text", "names": ["queue_depth"]}
    message = protocol.decode(json.dumps(_desired(scrape=scrape)))
    assert message["gpus"]["GPU-1"]["allocations"][0]["scrape"] == scrape  # type: ignore[typeddict-item]
    older = protocol.decode(json.dumps(_desired()))
    assert "scrape" not in older["gpus"]["GPU-1"]["allocations"][0]  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    "scrape",
    [
        {"port": "metrics", "path": "metrics", "names": ["q"]},
        {"port": "metrics", "path": "/a b", "names": ["q"]},
        {"port": "metrics", "path": "/m\r\nHost: evil", "names": ["q"]},
        {"port": "Metrics", "path": "/metrics", "names": ["q"]},
        {"port": "metrics", "path": "/metrics", "names": []},
        {"port": "metrics", "path": "/metrics", "names": ["a", "b", "c", "d", "e"]},
    ],
)
def test_a_scrape_out_of_its_bounds_is_refused(scrape):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(json.dumps(_desired(scrape=scrape)))
