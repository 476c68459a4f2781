"""Autoscaling on the real processes (issue 24): daphne, a Celery worker and beat (the
evaluation every 5 s), an agent running its replicas as processes, and ``manage.py
fleet_gateway`` running Debian's HAProxy, whose counters are the metric. A load step through
the gateway scales the deployment out; once the load is gone, it scales back in after the
cooldown, and a caller still sending a trickle of requests sees none of them fail.
"""

from __future__ import annotations

import http.client
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack import Stack, wait_until
from tests.e2e.test_endpoints import (
    HAPROXY,
    SYSTEM_PYTHON,
    Caller,
    _answers,
    server,
    start_gateway,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POLICY = {
    "min": 1,
    "max": 3,
    "target": {"requests_per_replica_per_s": 10},
    "scale_out_cooldown_s": 5,
    "scale_in_cooldown_s": 10,
}


def test_a_load_step_scales_out_and_the_quiet_after_scales_in_with_no_failed_request(
    stack: Stack, tmp_path: Path
) -> None:
    for needed in (SYSTEM_PYTHON, HAPROXY):
        if not needed.exists():
            pytest.skip(f"{needed} is missing")
    stack.allow_workloads()
    agent = stack.add_agent("as-1", ["a100-sxm4-40gb"] * 3, runtime="process")
    www = tmp_path / "www"
    www.mkdir()
    (www / "who").write_text("model\n")
    body = {
        "name": "as-model",
        "kind": "gpu",
        "gpu_count": 1,
        "replicas": 1,
        "auto": True,
        "workload": server(www, "1"),
        "endpoint": {"path_prefix": "/as-model", "drain_s": 1},
    }
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    deployment_id = created["id"]

    def ready() -> int:
        rows = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
        return sum(1 for r in rows if r["ready"])

    def count() -> int:
        return int(stack.get(f"/api/v1/deployments/{deployment_id}/")["replicas"])

    wait_until(lambda: ready() == 1, 60, what="the first replica ready")
    status, body = stack.request(
        "PATCH", f"/api/v1/deployments/{deployment_id}/", {"autoscaling": POLICY}
    )
    assert status == 200, body
    port, directory = start_gateway(stack, "gateway")
    try:
        wait_until(lambda: _answers(port, "/as-model/who"), 30, what="the gateway routing")
        # The load step: 3 callers without a pause, far past 10 requests per replica per second.
        with Caller(port, "/as-model/who", threads=3) as load:
            started = time.monotonic()
            wait_until(lambda: count() >= 2, 60, what="a scale-out")
            scaled_out_s = time.monotonic() - started
            wait_until(lambda: ready() >= 2, 60, what="the new replica ready")
            ready_s = time.monotonic() - started
        assert load.failed == [], load.failed
        assert len(stack.gpus(agent)) == 3
        ops = stack.get(f"/api/v1/operations/?deployment={deployment_id}&kind=autoscale")
        first = ops["results"][-1]
        assert first["payload"]["metric"] == "requests_per_replica_per_s", first
        assert first["payload"]["per_replica"] > 10, first
        # The quiet after: a trickle (one caller, 4 requests/s at most) falls under the target;
        # after the cooldown the deployment comes back to its minimum.
        with Caller(port, "/as-model/who", threads=1, pause_s=0.25) as trickle:
            wait_until(lambda: count() == 1, 90, what="the scale-in")
            wait_until(
                lambda: (
                    len(stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"])
                    == 1
                ),
                60,
                what="the surplus replica stopped",
            )
            time.sleep(1)
        assert trickle.failed == [], trickle.failed
        assert trickle.ok > 10
        print(f"scale-out decided after {scaled_out_s:.1f} s, new replica ready {ready_s:.1f} s")
        assert ready_s < 40  # beat every 5 s + the gateway's 5 s window + a process start
    finally:
        stack.terminate("gateway")
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/")
        shutil.rmtree(directory, ignore_errors=True)


def test_scaled_to_zero_the_first_request_is_held_until_a_replica_answers_it(
    stack: Stack, tmp_path: Path
) -> None:
    for needed in (SYSTEM_PYTHON, HAPROXY):
        if not needed.exists():
            pytest.skip(f"{needed} is missing")
    stack.allow_workloads()
    stack.add_agent("as-0", ["a100-sxm4-40gb"], runtime="process")
    www = tmp_path / "www"
    www.mkdir()
    (www / "who").write_text("woken\n")
    body = {
        "name": "as-zero",
        "kind": "gpu",
        "gpu_count": 1,
        "replicas": 1,
        "auto": True,
        "workload": server(www, "1"),
        "endpoint": {"path_prefix": "/as-zero"},
        "autoscaling": {
            "min": 0,
            "max": 1,
            "target": {"requests_per_replica_per_s": 5},
            "scale_in_cooldown_s": 5,
        },
    }
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    deployment_id = created["id"]
    port, directory = start_gateway(stack, "gateway-zero")
    try:
        # No request: after the cooldown it goes to zero replicas, and stays there.
        wait_until(
            lambda: stack.get(f"/api/v1/deployments/{deployment_id}/")["replicas"] == 0,
            90,
            what="the scale to zero",
        )
        wait_until(
            lambda: not stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"],
            60,
            what="the last replica stopped",
        )
        # The first request: held at the gateway while a replica is placed and starts.
        started = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            connection.request("GET", "/as-zero/who")
            answer = connection.getresponse()
            status, text = answer.status, answer.read().decode()
        finally:
            connection.close()
        cold_start_s = time.monotonic() - started
        assert (status, text.strip()) == (200, "woken"), (status, text)
        print(f"cold start (scale from zero to the first answer): {cold_start_s:.1f} s")
        assert stack.get(f"/api/v1/deployments/{deployment_id}/")["replicas"] == 1
    finally:
        stack.terminate("gateway-zero")
        stack.request("DELETE", f"/api/v1/deployments/{deployment_id}/")
        shutil.rmtree(directory, ignore_errors=True)


def test_a_replicas_own_prometheus_metric_above_its_target_scales_out_and_below_scales_in(
    stack: Stack, tmp_path: Path
) -> None:
    """The workload serves its own ``/metrics`` (a file the test rewrites: every replica serves
    the same directory); its agent reads it every 5 s and reports it in telemetry; beat's
    evaluation averages it over the ready replicas."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    stack.allow_workloads()
    stack.add_agent("as-m", ["a100-sxm4-40gb"] * 3, runtime="process")
    www = tmp_path / "www"
    www.mkdir()
    (www / "who").write_text("model\n")
    exposition = www / "metrics"

    def expose(waiting: float) -> None:
        exposition.write_text(
            "# TYPE queue_depth gauge\n"
            f'queue_depth{{model="a"}} {waiting / 2}\nqueue_depth{{model="b"}} {waiting / 2}\n'
        )

    expose(4.0)
    body = {
        "name": "as-prom",
        "kind": "gpu",
        "gpu_count": 1,
        "replicas": 1,
        "auto": True,
        "workload": server(www, "1"),
        "autoscaling": {
            "min": 1,
            "max": 3,
            "target": {"replica_metric": {"name": "queue_depth", "value": 5, "port": "http"}},
            "scale_out_cooldown_s": 5,
            "scale_in_cooldown_s": 10,
        },
    }
    status, created = stack.request("POST", "/api/v1/deployments/", body)
    assert status == 201, created
    deployment_id = created["id"]
    url = f"/api/v1/deployments/{deployment_id}/"

    def policy() -> dict[str, Any]:
        return dict(stack.get(url)["autoscaling"])

    def ready() -> int:
        rows = stack.get(f"/api/v1/allocations/?deployment={deployment_id}")["results"]
        return sum(1 for r in rows if r["ready"])

    try:
        # 4 waiting against a target of 5: read, and within reach of the target, it holds.
        wait_until(lambda: policy()["value"] == 4.0, 60, what="the metric read and evaluated")
        assert int(stack.get(url)["replicas"]) == 1
        started = time.monotonic()
        expose(20.0)  # 20 per replica: 4 wanted, 3 at most
        wait_until(lambda: int(stack.get(url)["replicas"]) == 3, 60, what="a scale-out")
        scaled_out_s = time.monotonic() - started
        wait_until(lambda: ready() == 3, 60, what="the new replicas ready")
        ops = stack.get(f"/api/v1/operations/?deployment={deployment_id}&kind=autoscale")
        out = ops["results"][-1]
        assert out["payload"]["metric"] == "replica_metric", out
        assert out["payload"]["metric_name"] == "queue_depth", out
        assert out["payload"]["per_replica"] == 20.0, out
        expose(1.0)  # far below: back to the minimum after the cooldown
        wait_until(lambda: int(stack.get(url)["replicas"]) == 1, 90, what="the scale-in")
        print(f"replica metric: scale-out decided {scaled_out_s:.1f} s after the metric rose")
        assert scaled_out_s < 30  # a 5 s scrape + telemetry + beat every 5 s
        # The workload stops exposing it: no made-up value, the policy says why.
        exposition.unlink()
        wait_until(
            lambda: policy()["state"] == "no_metric", 60, what="the metric reported as missing"
        )
        assert "queue_depth not available" in policy()["reason"], policy()
        assert "404" in policy()["reason"], policy()
    finally:
        stack.request("DELETE", url)
