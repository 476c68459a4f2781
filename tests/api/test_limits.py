"""Request limits: body caps (ASGI and per endpoint), JSON nesting, throttles, and the mig-parted
import that used to pin a CPU (security review H2, M4, L9)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from io import BytesIO
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from fleet.api.limits import BodySizeLimit
from fleet.api.parsers import JsonParser, json_depth
from fleet.core.errors import ServiceError
from fleet.inventory.services import host_create
from tests.factories import GpuFactory
from tests.helpers import assert_error, snapshot_rows

KIB = 1024
MIB = 1024 * KIB

BOMB = (
    "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
    '      mig-devices: {"1g.10gb+me": 20000}\n'
)


def post_json(client: APIClient, url: str, raw: bytes | str) -> Any:
    return client.generic("POST", url, raw, content_type="application/json")


def enrolled_agent(name: str) -> APIClient:
    _, enrollment = host_create(name=name)
    response = APIClient().post(
        "/api/v1/agent/enroll", {"enrollment_token": enrollment, "hostname": name}, format="json"
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    return client


@pytest.fixture
def rates(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Sets throttle rates for one test, counted in a cache of its own."""
    monkeypatch.setattr(SimpleRateThrottle, "cache", LocMemCache(f"t-{uuid.uuid4()}", {}))

    def set_rates(**scoped: str) -> None:
        for scope, rate in scoped.items():
            monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, scope, rate)

    return set_rates


# -- the mig-parted bomb (H2) --------------------------------------------------------------------


@pytest.mark.django_db
def test_a_viewers_migparted_bomb_is_refused_before_any_planning_and_changes_nothing(
    viewer_client, monkeypatch
):
    """Refused while parsing, from the count alone: the planner (which compares every pair of
    instances) is never reached. How fast that is, is measured by ``bench_refusals``, not
    timed here."""
    gpu = GpuFactory(product_key="h100-sxm5-80gb")

    def planner_reached(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the planner ran for a count no GPU can hold")

    monkeypatch.setattr("fleet.api.resources.mig.views.migparted_to_layout", planner_reached)
    before = snapshot_rows()
    response = viewer_client.post(
        "/api/v1/mig/migparted", {"gpu": gpu.pk, "config": "x", "yaml": BOMB}, format="json"
    )
    body = assert_error(response, 400, "migparted.invalid")
    assert body["details"]["count"] == 20000 and body["details"]["max_count"] == 7
    assert snapshot_rows() == before


@pytest.mark.django_db
def test_yaml_anchors_and_aliases_are_refused_by_the_migparted_import(viewer_client):
    gpu = GpuFactory(product_key="h100-sxm5-80gb")
    text = (
        "version: v1\nmig-configs:\n  a:\n    - &e {devices: all, mig-enabled: false}\n"
        "  b:\n    - *e\n"
    )
    response = viewer_client.post(
        "/api/v1/mig/migparted", {"gpu": gpu.pk, "config": "a", "yaml": text}, format="json"
    )
    assert "anchors and aliases" in assert_error(response, 400, "migparted.invalid")["message"]


@pytest.mark.django_db
def test_validating_more_instances_than_the_product_holds_is_one_violation(viewer_client):
    instances = [{"profile": "1g.6gb", "start": 0}] * 5
    body = viewer_client.post(
        "/api/v1/mig/validate", {"product": "a30-24gb", "instances": instances}, format="json"
    ).json()
    assert not body["valid"] and body["placements"] == []
    assert [v["code"] for v in body["violations"]] == ["mig.too_many_instances"]
    assert body["violations"][0]["details"] == {"count": 5, "max_instances": 4}


# -- body sizes and nesting (M4) -----------------------------------------------------------------


@pytest.mark.django_db
def test_an_enrolment_body_over_64_kib_is_refused_with_413():
    body = json.dumps({"enrollment_token": "x", "hostname": "h" * (64 * KIB)})
    response = post_json(APIClient(), "/api/v1/agent/enroll", body)
    assert assert_error(response, 413, "request.too_large")["details"] == {"max_bytes": 64 * KIB}


@pytest.mark.django_db
def test_other_bodies_are_capped_at_1_mib(viewer_client):
    body = json.dumps({"product": "a30-24gb", "instances": [], "pad": "x" * MIB})
    assert_error(post_json(viewer_client, "/api/v1/mig/validate", body), 413, "request.too_large")


@pytest.mark.django_db
def test_an_agent_report_may_pass_1_mib_but_not_4_mib():
    agent = enrolled_agent("gpu-01")
    two_mib = '{"messages": []' + " " * (2 * MIB) + "}"  # JSON whitespace: valid, and large
    assert post_json(agent, "/api/v1/agent/report", two_mib).json() == {"accepted": 0}
    five_mib = '{"messages": []' + " " * (5 * MIB) + "}"
    assert_error(post_json(agent, "/api/v1/agent/report", five_mib), 413, "request.too_large")


@pytest.mark.django_db
def test_a_100000_deep_json_body_is_a_400_envelope_not_a_500(viewer_client):
    deep = "[" * 100_000 + "]" * 100_000
    response = post_json(viewer_client, "/api/v1/mig/validate", deep)
    assert "nested deeper than 64" in assert_error(response, 400, "malformed_request")["message"]


@pytest.mark.django_db
def test_deep_json_sent_to_enrolment_is_a_400_envelope():
    deep = '{"hostname": ' + "[" * 20_000 + "]" * 20_000 + "}"
    assert_error(post_json(APIClient(), "/api/v1/agent/enroll", deep), 400, "malformed_request")


def test_the_depth_scan_ignores_brackets_inside_strings():
    assert json_depth(b'{"a": "[[[{{{", "b": [1, ["\\"]]]"]]}') == 3
    assert json_depth(b"[]") == 1 and json_depth(b'"x"') == 0


def test_the_parser_stops_reading_a_body_that_passes_its_cap(settings):
    settings.FLEET_MAX_JSON_BYTES = 10
    stream = BytesIO(b'{"a": "' + b"x" * 1000 + b'"}')
    with pytest.raises(ServiceError) as caught:
        JsonParser().parse(stream, "application/json", {})
    assert caught.value.status_code == 413
    assert stream.tell() == 11  # the cap plus the one byte that proves the body is too long


# -- throttles (L9, M4) --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_mig_endpoints_share_a_throttle_that_answers_429_with_retry_after(viewer_client, rates):
    rates(mig="2/min")
    body = {"product": "a30-24gb", "instances": []}
    for _ in range(2):
        assert viewer_client.post("/api/v1/mig/validate", body, format="json").status_code == 200
    response = viewer_client.post("/api/v1/mig/migparted", {}, format="json")
    assert_error(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0


@pytest.mark.django_db
def test_metrics_targets_and_defrag_share_the_expensive_throttle(viewer_client, rates):
    rates(expensive="1/min")
    assert viewer_client.get("/metrics").status_code == 200
    assert_error(viewer_client.get("/api/v1/deployments/1/targets"), 429, "throttled")
    assert_error(viewer_client.get("/api/v1/deployments/1/defrag"), 429, "throttled")
    assert viewer_client.get("/api/v1/hosts/").status_code == 200  # other reads are not in it


@pytest.mark.django_db
def test_every_user_has_a_default_throttle_of_their_own(viewer_client, operator_client, rates):
    rates(user="1/min")
    assert viewer_client.get("/api/v1/me").status_code == 200
    assert_error(viewer_client.get("/api/v1/me"), 429, "throttled")
    assert operator_client.get("/api/v1/me").status_code == 200


@pytest.mark.django_db
def test_agents_are_throttled_per_host_not_per_address(rates):
    first, second = enrolled_agent("gpu-01"), enrolled_agent("gpu-02")
    rates(agent="1/min", anon="1/min")
    assert first.get("/api/v1/agent/desired-state").status_code == 204
    assert_error(first.get("/api/v1/agent/desired-state"), 429, "throttled")
    assert second.get("/api/v1/agent/desired-state").status_code == 204


@pytest.mark.django_db
def test_a_forged_forwarded_for_header_does_not_reset_the_enrolment_throttle(rates):
    rates(enroll="1/min")
    client = APIClient()
    for address in ("10.0.0.1", "10.0.0.2"):
        response = client.post(
            "/api/v1/agent/enroll", {}, format="json", HTTP_X_FORWARDED_FOR=address
        )
    assert_error(response, 429, "throttled")


@pytest.mark.django_db
def test_behind_one_proxy_the_forwarded_client_address_is_throttled(settings, rates):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    rates(enroll="1/min")
    client = APIClient()

    def enroll_from(address: str) -> int:
        return client.post(
            "/api/v1/agent/enroll", {}, format="json", HTTP_X_FORWARDED_FOR=f"1.2.3.4, {address}"
        ).status_code

    assert [enroll_from("10.0.0.1"), enroll_from("10.0.0.2"), enroll_from("10.0.0.1")] == [
        400,
        400,
        429,
    ]


@pytest.mark.django_db
def test_throttles_let_requests_through_while_redis_is_unreachable(
    viewer_client, monkeypatch, rates
):
    rates(user="1/min")
    nobody_listens = RedisCache("redis://127.0.0.1:1/0", {"OPTIONS": {"socket_timeout": 0.5}})
    monkeypatch.setattr(SimpleRateThrottle, "cache", nobody_listens)
    assert [viewer_client.get("/api/v1/me").status_code for _ in range(3)] == [200] * 3


@pytest.mark.django_db
def test_the_openapi_schema_documents_413_and_429_where_they_can_happen(viewer_client):
    paths = viewer_client.get("/api/schema/", {"format": "json"}).json()["paths"]
    assert {"413", "429"} <= set(paths["/api/v1/mig/migparted"]["post"]["responses"])
    assert {"413", "429"} <= set(paths["/api/v1/agent/report"]["post"]["responses"])
    targets = paths["/api/v1/deployments/{id}/targets"]["get"]["responses"]
    assert "429" in targets and "413" not in targets


# -- the ASGI body cap ---------------------------------------------------------------------------


class _App:
    """An ASGI app that reads the whole body and answers 200 with its length."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.called = True
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})


def _run(app: Any, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> list[dict]:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _refusal(sent: list[dict]) -> dict:
    start, body = sent
    assert start["status"] == 413
    assert (b"content-type", b"application/json") in start["headers"]
    return json.loads(body["body"])


def test_the_asgi_cap_refuses_a_declared_length_over_it_without_calling_the_app():
    app = _App()
    sent = _run(BodySizeLimit(app, max_bytes=10), [b"x" * 11], [(b"content-length", b"11")])
    assert _refusal(sent) == {
        "code": "request.too_large",
        "message": "The request body is larger than 10 bytes.",
        "details": {"max_bytes": 10},
    }
    assert not app.called


def test_the_asgi_cap_stops_reading_a_chunked_body_once_it_passes_the_cap():
    app = _App()
    chunks = [b"x" * 6, b"x" * 6, b"x" * 6]
    sent = _run(BodySizeLimit(app, max_bytes=10), chunks, [])
    assert _refusal(sent)["code"] == "request.too_large"
    assert app.called


def test_the_asgi_cap_passes_bodies_within_it_through():
    sent = _run(BodySizeLimit(_App(), max_bytes=10), [b"x" * 5, b"x" * 5], [])
    assert [m.get("status") for m in sent] == [200, None] and sent[1]["body"] == b"10"


def test_the_asgi_cap_leaves_other_protocols_alone():
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    limit = BodySizeLimit(app, max_bytes=0)
    asyncio.run(limit({"type": "lifespan"}, None, None))  # type: ignore[arg-type]
    assert seen == ["lifespan"]


def test_the_served_application_refuses_a_chunked_body_over_the_global_cap(settings):
    from fleet.asgi import application

    chunks = [b"x" * MIB] * 9  # 9 MiB in 1 MiB chunks, no Content-Length
    sent = _run(application, chunks, [(b"host", b"testserver")])
    assert _refusal(sent)["details"] == {"max_bytes": settings.FLEET_MAX_REQUEST_BYTES}


# -- ids no database column holds --------------------------------------------------------------

BIG = 2**70  # past a 64-bit id: PostgreSQL finds nothing, SQLite could not even bind it


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("get", f"/api/v1/gpus/{BIG}/", None),
        ("get", f"/api/v1/deployments/{BIG}/", None),
        ("get", f"/api/v1/allocations/?deployment={BIG}", None),
        ("get", "/api/v1/allocations/?gpu=7.5", None),
        ("get", f"/api/v1/gpus/?host={BIG}", None),
        ("get", f"/api/v1/operations/?deployment={BIG}", None),
        ("get", f"/api/v1/events/?gpu={BIG}", None),
        ("get", f"/api/v1/partitions/?gpu={BIG}", None),
        ("post", f"/api/v1/deployments/{BIG}/place", {"gpu": BIG}),
        ("post", f"/api/v1/allocations/{BIG}/move", {"gpu": BIG}),
        ("put", f"/api/v1/gpus/{BIG}/layout", {"mode": "mps"}),
        ("post", "/api/v1/rollouts/", {"selector": {"gpus": [BIG]}, "layout": {"mode": "mps"}}),
        ("post", "/api/v1/rollouts/", {"selector": {"hosts": [BIG]}, "layout": {"mode": "mps"}}),
        ("put", "/api/v1/teams/1/members", {"members": [{"user": BIG, "role": "viewer"}]}),
    ],
)
def test_an_id_past_64_bits_is_a_4xx_on_every_database(admin_client, method, url, body):
    call = getattr(admin_client, method)
    response = call(url, body, format="json") if body is not None else call(url)
    assert 400 <= response.status_code < 500, response.content[:300]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "raw",
    [
        '{"selector": {"\\udb3f": {}}, "layout": {}}',  # a lone surrogate: no response can quote it
        '{"selector": {}, "max_unavailable": 1e400}',  # overflows a double
        '{"selector": {}, "max_unavailable": NaN}',
        # U+0000, which PostgreSQL cannot store or compare: a 500 there (schemathesis, PATCH
        # /deployments/{id}/ with a team name and POST /rollouts/ with a label holding it)
        '{"selector": {"labels": {"a": "b\\u0000"}}, "layout": {}}',
        '{"selector": {"labels": {"a\\\\\\u0000": "b"}}, "layout": {}}',
    ],
)
def test_json_that_is_not_valid_unicode_or_strict_json_is_a_400_envelope(operator_client, raw):
    before = snapshot_rows()
    response = post_json(operator_client, "/api/v1/rollouts/", raw)
    assert_error(response, 400, "malformed_request")
    assert snapshot_rows() == before


@pytest.mark.django_db
def test_an_escaped_backslash_before_u0000_is_text_not_nul(operator_client):
    raw = '{"product": "a\\\\u0000", "instances": []}'  # "a", a backslash, "u0000"
    response = post_json(operator_client, "/api/v1/mig/validate", raw)
    assert response.status_code in (400, 404)
    assert response.json()["code"] != "malformed_request"


@pytest.mark.django_db
def test_a_surrogate_pair_is_one_character_and_is_quoted_back(operator_client):
    raw = '{"product": "\\ud83d\\ude00", "instances": []}'
    response = post_json(operator_client, "/api/v1/mig/validate", raw)
    assert response.status_code in (400, 404)
    assert "\U0001f600" in response.content.decode()


@pytest.mark.django_db
def test_an_astral_character_in_a_mig_parted_config_is_quoted_back_whole(operator_client):
    """The dict is read as YAML: an escaped astral character came back as two lone surrogate
    halves, and the error quoting it was a 500 (schemathesis, POST /rollouts/)."""
    raw = (
        '{"selector": {}, "migparted": {"name": "a", "config": {"\\ud835\\udc13": 1, '
        '"version": "v1", "mig-configs": {}}}}'
    )
    response = post_json(operator_client, "/api/v1/rollouts/", raw)
    assert 400 <= response.status_code < 500
    assert "\U0001d413" in response.content.decode()
