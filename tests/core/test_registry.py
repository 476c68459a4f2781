"""Image digest pinning at deploy time (fleet.core.registry), against a registry stub on
loopback that implements only ``HEAD /v2/<name>/manifests/<tag>`` (and an anonymous token
endpoint): a tag is pinned to the digest the registry serves, the agents are told the pinned
``name@sha256:…``, and where no registry answers the tag is kept with the reason, visible in
the API. Only a registry the admin allows (``FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE``) on a private
address is asked, and every call ends within ``FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS``."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleet.agents.documents import host_desired_state
from fleet.allocations.models import Deployment
from fleet.core.registry import ACCEPT, ImageRef
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory

pytestmark = pytest.mark.django_db

INDEX = "application/vnd.oci.image.index.v1+json"


def digest_of(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class RegistryStub:
    """A registry on loopback: ``tags`` maps ``<repository>:<tag>`` to the digest served;
    with ``token`` set, manifests need ``Authorization: Bearer <token>``, which its ``/token``
    endpoint hands out anonymously. ``requests`` records (method, path, headers)."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.token: str | None = None
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                stub.requests.append(("HEAD", self.path, dict(self.headers)))
                prefix, _, rest = self.path.partition("/v2/")
                name, _, tag = rest.partition("/manifests/")
                if prefix or not tag:
                    self._answer(404)
                elif stub.token and self.headers.get("Authorization") != f"Bearer {stub.token}":
                    realm = f"http://{stub.host}/token"
                    challenge = (
                        f'Bearer realm="{realm}",service="stub",scope="repository:{name}:pull"'
                    )
                    self._answer(401, {"WWW-Authenticate": challenge})
                elif f"{name}:{tag}" in stub.tags and INDEX in self.headers.get("Accept", ""):
                    headers = {"Docker-Content-Digest": stub.tags[f"{name}:{tag}"]}
                    self._answer(200, {"Content-Type": INDEX, **headers})
                else:
                    self._answer(404)

            def do_GET(self) -> None:
                stub.requests.append(("GET", self.path, dict(self.headers)))
                if self.path.startswith("/token?") and stub.token:
                    body = json.dumps({"token": stub.token}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._answer(404)

            def _answer(self, status: int, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry(settings: Any) -> Iterator[RegistryStub]:
    """The stub, with pinning on and the stub allowed (loopback, plain HTTP)."""
    stub = RegistryStub()
    settings.FLEET_IMAGE_PINNING = True
    settings.FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE = True
    settings.FLEET_IMAGE_REGISTRY_INSECURE = [stub.host]
    settings.FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS = 3.0
    yield stub
    stub.close()


def create(client: Any, image: str, name: str = "app", **extra: Any) -> Any:
    body = {
        "name": name,
        "kind": "mps",
        "memory_mib": 1024,
        "workload": {"runtime": "container", "image": image, "user": "1000"},
        **extra,
    }
    return client.post("/api/v1/deployments/", body, format="json")


@pytest.mark.parametrize(
    ("image", "registry", "repository", "tag", "digest"),
    [
        ("python", "docker.io", "library/python", "latest", None),
        ("python:3.11", "docker.io", "library/python", "3.11", None),
        ("org/app:1", "docker.io", "org/app", "1", None),
        ("index.docker.io/python:3", "docker.io", "library/python", "3", None),
        ("reg.example:5000/team/app:v2", "reg.example:5000", "team/app", "v2", None),
        ("localhost/app", "localhost", "app", "latest", None),
        (f"app@{digest_of('x')}", "docker.io", "library/app", "latest", digest_of("x")),
    ],
)
def test_a_reference_is_read_as_docker_reads_it(image, registry, repository, tag, digest):
    ref = ImageRef.parse(image)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


def test_a_tag_is_pinned_to_the_digest_the_registry_serves_and_the_agent_pulls_it(
    registry, admin_client
):
    digest = digest_of("index v1")
    registry.tags["team/app:1"] = digest
    host = HostFactory(runtime="docker")
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))

    response = create(admin_client, f"{registry.host}/team/app:1", auto=True)

    assert response.status_code == 201, response.json()
    workload = response.json()["workload"]
    assert workload["image"] == f"{registry.host}/team/app:1"  # as given
    assert workload["image_pin"]["reference"] == f"{registry.host}/team/app@{digest}"
    assert workload["image_pin"]["reason"] == ""
    [(method, path, headers)] = registry.requests
    assert (method, path) == ("HEAD", "/v2/team/app/manifests/1")
    assert headers["Accept"] == ACCEPT  # OCI indexes and manifest lists first
    [desired] = host_desired_state(host)["gpus"][gpu.uuid]["allocations"]
    assert desired["workload"]["image"] == f"{registry.host}/team/app@{digest}"


def test_a_bearer_challenge_is_answered_with_an_anonymous_token(registry, admin_client):
    registry.token = "anonymous-pull-token"
    registry.tags["library/python:3.11"] = digest_of("python")
    registry.tags["team/app:1"] = digest_of("app")

    response = create(admin_client, f"{registry.host}/team/app:1")

    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] == f"{registry.host}/team/app@{digest_of('app')}", pin
    methods = [(m, p.split("?")[0]) for m, p, _ in registry.requests]
    assert methods == [
        ("HEAD", "/v2/team/app/manifests/1"),
        ("GET", "/token"),
        ("HEAD", "/v2/team/app/manifests/1"),
    ]
    assert "scope=repository%3Ateam%2Fapp%3Apull" in registry.requests[1][1]


def test_an_unknown_tag_keeps_the_tag_and_says_why(registry, admin_client):
    response = create(admin_client, f"{registry.host}/team/app:missing")

    assert response.status_code == 201, response.json()
    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] is None and "404" in pin["reason"]
    deployment = Deployment.objects.get()
    assert deployment.workload["image"] == f"{registry.host}/team/app:missing"


def test_a_private_registry_is_not_asked_unless_the_admin_allows_it(
    registry, admin_client, settings
):
    settings.FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE = False
    registry.tags["team/app:1"] = digest_of("app")

    response = create(admin_client, f"{registry.host}/team/app:1")

    assert response.status_code == 201, response.json()
    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] is None
    assert "FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE" in pin["reason"]
    assert registry.requests == []


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_a_registry_that_never_answers_costs_the_timeout_and_keeps_the_tag(
    registry, admin_client, settings, silent_port
):
    settings.FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS = 1.0
    settings.FLEET_IMAGE_REGISTRY_INSECURE = [f"127.0.0.1:{silent_port}"]
    started = time.monotonic()

    response = create(admin_client, f"127.0.0.1:{silent_port}/team/app:1")

    assert time.monotonic() - started < 3
    assert response.status_code == 201, response.json()
    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] is None and "FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS" in pin["reason"]


def test_where_no_registry_answers_the_tag_is_kept(registry, admin_client, settings):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    settings.FLEET_IMAGE_REGISTRY_INSECURE = [f"127.0.0.1:{port}"]

    response = create(admin_client, f"127.0.0.1:{port}/team/app:1")

    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] is None and pin["reason"].startswith("no registry answered")


def test_an_image_the_policy_refuses_asks_no_registry(registry, admin_client):
    from fleet.core.models import Team

    Team.objects.filter(slug="default").update(policy={"registries": ["registry.example.com/"]})
    registry.tags["team/app:1"] = digest_of("app")

    response = create(admin_client, f"{registry.host}/team/app:1")

    assert response.status_code == 422 and response.json()["code"] == "policy.image_denied"
    assert registry.requests == []


def test_a_rolling_update_pins_the_tag_again_and_keeps_the_old_pin_for_a_rollback(
    registry, admin_client
):
    registry.tags["team/app:1"] = digest_of("first")
    created = create(admin_client, f"{registry.host}/team/app:1").json()
    registry.tags["team/app:1"] = digest_of("moved")  # the tag moved since

    changed = admin_client.patch(
        f"/api/v1/deployments/{created['id']}/",
        {
            "workload": {
                "runtime": "container",
                "image": f"{registry.host}/team/app:1",
                "user": "1000",
                "env": {"MODE": "fast"},
            }
        },
        format="json",
    )

    assert changed.status_code == 202, changed.json()
    deployment = Deployment.objects.get()
    assert deployment.workload["image_pin"]["reference"].endswith(digest_of("moved"))
    from fleet.core.models import Operation
    from fleet.workflows.deployment_rollouts import _sealed_previous

    rollout = Operation.objects.get(kind="rollout")
    previous = _sealed_previous(rollout.payload)
    assert previous["image_pin"]["reference"].endswith(digest_of("first"))


def test_an_image_given_by_digest_is_its_own_pin_and_asks_no_registry(registry, admin_client):
    image = f"{registry.host}/team/app@{digest_of('given')}"

    response = create(admin_client, image)

    assert response.json()["workload"]["image_pin"]["reference"] == image
    assert registry.requests == []


def test_with_pinning_off_the_tag_is_kept_and_the_api_says_so(admin_client, settings):
    settings.FLEET_IMAGE_PINNING = False

    response = create(admin_client, "registry.example.com/team/app:1")

    pin = response.json()["workload"]["image_pin"]
    assert pin["reference"] is None and "FLEET_IMAGE_PINNING" in pin["reason"]


@pytest.mark.django_db
def test_a_workload_without_an_image_answers_a_null_pin(admin_client):
    """The schema's ``image_pin`` is in every full answer (schemathesis: it was left out)."""
    body = {"name": "plain", "kind": "mps", "memory_mib": 1024}
    created = admin_client.post("/api/v1/deployments/", body, format="json")
    assert created.status_code == 201, created.json()
    answer = admin_client.get(f"/api/v1/deployments/{created.json()['id']}/").json()
    assert answer["workload"]["image_pin"] is None and answer["workload"]["redacted"] is False
