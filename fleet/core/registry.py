"""Image digest pinning: a container image's tag resolved, at deploy time, to the digest its
registry serves, so that every replica pulls the same image however the tag moves later.

The registry is asked as ``docker pull`` asks it (Docker Registry HTTP API v2, the OCI
distribution spec): ``HEAD /v2/<name>/manifests/<tag>`` accepting OCI image indexes and Docker
manifest lists (a multi-platform tag's digest is its index's: each host's runtime picks its
platform from it) as well as single manifests; the digest is the answer's
``Docker-Content-Digest``. A ``401`` with a ``Bearer`` challenge is answered with an anonymous
token from the challenge's realm (Docker Hub's way); a registry that wants credentials keeps the
tag. Everything goes through :mod:`fleet.core.outbound` within
``FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS`` (3 s) in all: no local or private registry unless
``FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE``, HTTPS unless the registry is listed in
``FLEET_IMAGE_REGISTRY_INSECURE`` (Docker's ``insecure-registries``).

Where no registry answers (an air-gapped fleet), the tag is kept and the reason recorded:
:func:`image_pin` never fails a deployment.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings

from fleet.core.outbound import Answer, Guard, RefusedDestination, http_request

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
USER_AGENT = "fleet-image-pinning/1"
DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_TOKEN_BYTES = 64 * 1024
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PARAM = re.compile(r'(\w+)="([^"]*)"')


class PinError(Exception):
    """Why the tag could not be pinned (said in the API, never an error to the user)."""


@dataclass(frozen=True)
class ImageRef:
    """An image reference taken apart as Docker reads it.

    Attributes:
        name: the reference without tag or digest, as given (``python``, ``reg:5000/team/app``).
        registry: the registry's host[:port] (``docker.io`` for Docker Hub).
        repository: the path on the registry (``library/python`` for ``python``).
        tag: the tag (``latest`` when none is given).
        digest: the digest it already names, if any.
    """

    name: str
    registry: str
    repository: str
    tag: str
    digest: str | None

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        named, _, digest = image.partition("@")
        slash, colon = named.rfind("/"), named.rfind(":")
        name, tag = (named[:colon], named[colon + 1 :]) if colon > slash else (named, "latest")
        first, sep, rest = name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            registry, repository = first, rest
        else:
            registry, repository = DOCKER_HUB, name if sep else f"library/{name}"
        if registry == "index.docker.io":
            registry = DOCKER_HUB
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        return cls(name, registry, repository, tag, digest or None)

    def manifest_url(self) -> str:
        insecure = self.registry in settings.FLEET_IMAGE_REGISTRY_INSECURE
        endpoint = DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry
        scheme = "http" if insecure else "https"
        return f"{scheme}://{endpoint}/v2/{self.repository}/manifests/{self.tag}"


def _guard() -> Guard:
    return Guard(
        allow_private=bool(settings.FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE),
        purpose="serve images to pin",
        allow_setting="FLEET_IMAGE_REGISTRY_ALLOW_PRIVATE",
        timeout_setting="FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS",
    )


def _call(method: str, url: str, headers: dict[str, str], deadline: float, limit: int) -> Answer:
    """One request, its failures as :class:`PinError` in words an operator acts on."""
    try:
        return http_request(
            method,
            url,
            headers={"User-Agent": USER_AGENT, **headers},
            deadline=deadline,
            guard=_guard(),
            max_body=limit,
        )
    except RefusedDestination as exc:
        raise PinError(str(exc)) from None
    except TimeoutError:
        seconds = float(settings.FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS)
        raise PinError(
            f"no answer within FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS ({seconds:g} s) from {url}"
        ) from None
    except (OSError, ValueError) as exc:
        raise PinError(f"no registry answered: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # http.client's and ssl's own errors: a garbled answer
        raise PinError(f"the registry's answer was not understood: {type(exc).__name__}") from None


def _token(challenge: str, deadline: float) -> str:
    """An anonymous pull token for a ``Bearer realm=…,service=…,scope=…`` challenge."""
    params = dict(_PARAM.findall(challenge))
    realm = params.pop("realm", "")
    if urlsplit(realm).scheme not in ("http", "https"):
        raise PinError("the registry's token challenge names no usable realm")
    query = urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
    answer = _call("GET", f"{realm}?{query}" if query else realm, {}, deadline, MAX_TOKEN_BYTES)
    if answer.status != 200:
        raise PinError(
            f"the registry wants credentials (its token service answered {answer.status})"
        )
    try:
        body: Any = json.loads(answer.body)
        token = body.get("token") or body.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise PinError("the registry's token service gave no token")
    return token


def _digest_of(
    answer: Answer, ref: ImageRef, url: str, headers: dict[str, str], deadline: float
) -> str:
    digest = answer.headers.get("docker-content-digest", "").strip()
    if _DIGEST.match(digest):
        return digest
    # A registry that does not say it on HEAD: the digest of the manifest's bytes (the spec's).
    got = _call("GET", url, headers, deadline, MAX_MANIFEST_BYTES + 1)
    if got.status != 200 or not got.body or len(got.body) > MAX_MANIFEST_BYTES:
        raise PinError(f"the registry gave no digest for {ref.name}:{ref.tag}")
    return "sha256:" + hashlib.sha256(got.body).hexdigest()


def resolve_digest(ref: ImageRef, deadline: float) -> str:
    """The ``sha256:…`` the registry serves for ``ref``'s tag now.

    Raises:
        PinError: no answer, a refused address, credentials wanted, no such tag.
    """
    url = ref.manifest_url()
    headers = {"Accept": ACCEPT}
    answer = _call("HEAD", url, headers, deadline, 0)
    challenge = answer.headers.get("www-authenticate", "")
    if answer.status == 401 and challenge.lower().startswith("bearer "):
        headers["Authorization"] = f"Bearer {_token(challenge, deadline)}"
        answer = _call("HEAD", url, headers, deadline, 0)
    if answer.status == 200:
        return _digest_of(answer, ref, url, headers, deadline)
    if answer.status in (401, 403):
        raise PinError(f"the registry wants credentials to read {ref.name} ({answer.status})")
    if answer.status == 404:
        raise PinError(f"the registry has no {ref.name}:{ref.tag} (404)")
    raise PinError(f"the registry answered {answer.status}")


def image_pin(image: str, *, now: datetime) -> dict[str, Any]:
    """What a deployment stores of ``image``'s pinning: ``{"image", "reference", "reason",
    "at"}``. ``reference`` is ``name@sha256:…`` (what the agents pull) or ``None`` with the
    ``reason`` the tag was kept; an image given by digest is its own reference."""
    ref = ImageRef.parse(image)
    stored: dict[str, Any] = {
        "image": image,
        "reference": None,
        "reason": "",
        "at": now.isoformat(),
    }
    if ref.digest is not None:
        stored["reference"] = image
        return stored
    if not settings.FLEET_IMAGE_PINNING:
        stored["reason"] = "image pinning is off (FLEET_IMAGE_PINNING)"
        return stored
    deadline = time.monotonic() + float(settings.FLEET_IMAGE_RESOLVE_TIMEOUT_SECONDS)
    try:
        stored["reference"] = f"{ref.name}@{resolve_digest(ref, deadline)}"
    except PinError as exc:
        stored["reason"] = str(exc)[:500]
    return stored


# --------------------------------------------------------------------------------------------
# The pin in a stored workload
# --------------------------------------------------------------------------------------------

PIN_KEY = "image_pin"
"""Where a deployment's (or a replica copy's) stored workload keeps its image's pin, beside the
protocol's fields: it travels with the workload to every copy a placement, a move or a rolling
update makes, and :func:`fleet.allocations.workloads.workload_of` leaves it out."""


def workload_pinned(workload: Mapping[str, Any], *, allowed: bool, now: datetime) -> dict[str, Any]:
    """The workload to store: a container's with its image's pin (:func:`image_pin`), resolved
    only when ``allowed`` (its team's policy lets the image in: no registry is asked for an
    image that will be refused)."""
    stored = {k: v for k, v in workload.items() if k != PIN_KEY}
    if stored.get("runtime") == "container" and allowed:
        stored[PIN_KEY] = image_pin(str(stored.get("image", "")), now=now)
    return stored


def pin_of(stored: Any, image: str) -> dict[str, Any] | None:
    """The pin a stored workload holds for ``image`` (``None``: none, or one of another image,
    as a row edited by hand could hold)."""
    pin = stored.get(PIN_KEY) if isinstance(stored, Mapping) else None
    if isinstance(pin, Mapping) and pin.get("image") == image:
        return dict(pin)
    return None


def pinned_reference(stored: Any, image: str) -> str | None:
    """What the agents pull for ``image``: the pinned ``name@sha256:…``, else ``None`` (the
    tag)."""
    pin = pin_of(stored, image)
    reference = pin.get("reference") if pin else None
    if isinstance(reference, str) and ImageRef.parse(reference).name == ImageRef.parse(image).name:
        return reference
    return None
