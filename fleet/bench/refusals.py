"""``bench_refusals``: how long the server takes to refuse the requests that used to cost it work.

What runs: the scratch fleet of :func:`fleet.bench.fleet_view.scratch_server` (one host of 8
H100s, known as after its agent's first hello; a viewer with an API token) and one daphne
process on loopback, on SQLite or a scratch PostgreSQL database. The throttles are lifted for the
run (``FLEET_THROTTLE_*``), so that every request reaches the check that refuses it; with them
on, a flood is answered 429 before that.

Each case is sent ``--repeat`` times on a new connection each, after three warm-up requests, as
the viewer (enrolment: without credentials). A case's time runs from the first byte sent to the
response's status line and headers read. Every answer must be the refusal the case names
(status and error ``code``); ``as_expected`` says so and ``answers`` counts what came back.

The cases (security review H2 and M4): a mig-parted config asking for 20,000 instances (the
planner used to compare every pair: no answer within 60 s), a YAML alias bomb, a 100,000-deep
JSON body, a body over the 1 MiB parser cap, a 9 MiB body (over the 8 MiB cap in front of
Django; daphne reads a body whole before the application sees the request, so this case's time
includes sending it over loopback), an enrolment body over 64 KiB, and more MIG instances to
validate than the serializer takes.
"""

from __future__ import annotations

import http.client
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleet.bench.fleet_view import ViewOptions, scratch_server, seeded

KIB = 1024
MIB = 1024 * KIB
WARMUP = 3
GOAL_MS = 100.0
LIFTED = "1000000/min"
THROTTLES = ("USER", "ANON", "ENROLL", "MIG", "EXPENSIVE")

COUNT_BOMB = (
    "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
    '      mig-devices: {"1g.10gb+me": 20000}\n'
)
ALIAS_BOMB = (
    "\n".join(
        ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
        + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    )
    + "\nversion: v1\n"
)


@dataclass(frozen=True)
class Case:
    """One request and the refusal it must get."""

    name: str
    path: str
    body: bytes
    status: int
    code: str
    authenticated: bool = True


@dataclass
class RefusalOptions:
    repeat: int = 50
    database_url: str = ""
    workdir: Path | None = None
    log: Callable[[str], None] = print
    env: dict[str, str] = field(default_factory=dict)


def cases(gpu_id: int) -> list[Case]:
    def body(value: Any) -> bytes:
        return json.dumps(value).encode()

    return [
        Case(
            "migparted_count_bomb",
            "/api/v1/mig/migparted",
            body({"gpu": gpu_id, "config": "x", "yaml": COUNT_BOMB}),
            400,
            "migparted.invalid",
        ),
        Case(
            "migparted_alias_bomb",
            "/api/v1/mig/migparted",
            body({"gpu": gpu_id, "config": "x", "yaml": ALIAS_BOMB}),
            400,
            "migparted.invalid",
        ),
        Case(
            "validate_20000_instances",
            "/api/v1/mig/validate",
            body({"product": "h100-sxm5-80gb", "instances": [{"profile": 19, "start": 0}] * 20000}),
            400,
            "invalid",
        ),
        Case(
            "json_100000_deep",
            "/api/v1/mig/validate",
            b"[" * 100_000 + b"]" * 100_000,
            400,
            "malformed_request",
        ),
        Case(
            "body_over_1_mib",
            "/api/v1/mig/validate",
            body({"product": "h100-sxm5-80gb", "instances": [], "pad": "x" * MIB}),
            413,
            "request.too_large",
        ),
        Case(
            "body_over_8_mib",
            "/api/v1/mig/validate",
            body({"product": "h100-sxm5-80gb", "instances": [], "pad": "x" * (9 * MIB)}),
            413,
            "request.too_large",
        ),
        Case(
            "enrolment_over_64_kib",
            "/api/v1/agent/enroll",
            body({"enrollment_token": "x", "hostname": "h" * (64 * KIB)}),
            413,
            "request.too_large",
            authenticated=False,
        ),
    ]


def run_refusal_bench(options: RefusalOptions) -> dict[str, Any]:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="fleet-refusal-bench-"))
    lifted = {f"FLEET_THROTTLE_{name}": LIFTED for name in THROTTLES}
    view = ViewOptions(
        sizes=[8],
        database_url=options.database_url,
        workdir=workdir,
        log=options.log,
        env={**lifted, **options.env},
    )
    with scratch_server(workdir, 8, view) as (url, _):
        token = str(seeded(workdir)["api_token"])
        gpu_id = _first_gpu(url, token)
        results = {}
        for case in cases(gpu_id):
            options.log(f"{case.name}: {options.repeat} requests")
            results[case.name] = _measure(url, token, case, options.repeat)
    worst = max(r["max_ms"] for r in results.values())
    return {
        "database": "postgresql" if options.database_url else "sqlite",
        "requests_per_case": options.repeat,
        "goal_ms": GOAL_MS,
        "cases": results,
        "all_as_expected": all(r["as_expected"] for r in results.values()),
        "max_ms": worst,
        "all_within_goal": worst < GOAL_MS,
    }


def _first_gpu(url: str, token: str) -> int:
    status, body = _send(url, "GET", "/api/v1/gpus/?limit=1", b"", token)
    if status != 200:
        raise RuntimeError(f"GET /api/v1/gpus/ answered {status}")
    return int(json.loads(body)["results"][0]["id"])


def _measure(url: str, token: str, case: Case, repeat: int) -> dict[str, Any]:
    times: list[float] = []
    answers: Counter[str] = Counter()
    for attempt in range(WARMUP + repeat):
        started = time.perf_counter()
        status, body = _send(
            url, "POST", case.path, case.body, token if case.authenticated else None
        )
        elapsed = (time.perf_counter() - started) * 1000
        if attempt < WARMUP:
            continue
        times.append(elapsed)
        answers[f"{status} {_code(body)}"] += 1
    ordered = sorted(times)
    return {
        "expected": f"{case.status} {case.code}",
        "answers": dict(answers),
        "as_expected": set(answers) == {f"{case.status} {case.code}"},
        "request_bytes": len(case.body),
        "p50_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "max_ms": round(ordered[-1], 2),
    }


def _send(url: str, method: str, path: str, body: bytes, token: str | None) -> tuple[int, bytes]:
    """One request on a new connection; the status and the body of the answer."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    try:
        connection.putrequest(method, path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Accept", "application/json")
        if token is not None:
            connection.putheader("Authorization", f"Token {token}")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _code(body: bytes) -> str:
    try:
        return str(json.loads(body).get("code", "-"))
    except (ValueError, AttributeError):
        return "not-json"
