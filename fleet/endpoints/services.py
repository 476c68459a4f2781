"""Writes of endpoints: a deployment's endpoint set, changed or removed, each an audited
operation. Nothing changes when a call raises."""

from __future__ import annotations

import re
from typing import Any, TypedDict

from django.conf import settings
from django.db import IntegrityError, transaction

from fleet.allocations.models import Deployment
from fleet.allocations.resend import resend_on_commit
from fleet.allocations.workloads import workload_of
from fleet.core.errors import Conflict, NotFound, RuleViolation, ServiceError
from fleet.core.events import publish_changed
from fleet.core.models import OperationKind, OperationStatus
from fleet.core.operations import operation_record
from fleet.domain import Violation
from fleet.endpoints.models import DEFAULT_DRAIN_S, Endpoint
from hostagent import protocol
from hostagent.protocol import MAX_DRAIN_S

PATH_PREFIX = re.compile(r"^/[A-Za-z0-9._~-]{1,63}$")
HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+$"
)


class EndpointSpec(TypedDict, total=False):
    port: str
    path_prefix: str | None
    hostname: str | None


def _drain(spec: dict[str, Any], current: Endpoint | None) -> int:
    drain = spec.get("drain_s", current.drain_s if current else DEFAULT_DRAIN_S)
    if isinstance(drain, bool) or not isinstance(drain, int) or not 0 <= drain <= MAX_DRAIN_S:
        raise ServiceError(
            "endpoint.invalid",
            f"'drain_s' is a whole number of seconds from 0 to {MAX_DRAIN_S}: how long a "
            "replica stays up out of rotation before it is stopped.",
            {"field": "drain_s"},
        )
    return int(drain)


def _checked(spec: Any) -> tuple[str | None, str | None, str | None]:
    if not isinstance(spec, dict):
        raise ServiceError("endpoint.invalid", "'endpoint' is an object or null.")
    unknown = sorted(set(spec) - {"port", "path_prefix", "hostname", "drain_s"})
    if unknown:
        raise ServiceError(
            "endpoint.invalid",
            f"Unknown endpoint field {unknown[0][:40]!r}.",
            {"field": unknown[0][:40]},
        )
    port, prefix, hostname = spec.get("port"), spec.get("path_prefix"), spec.get("hostname")
    if port is not None and not (
        isinstance(port, str) and re.match(protocol.PORT_NAME_PATTERN, port)
    ):
        raise ServiceError(
            "endpoint.invalid", "'port' is the name of a port the workload declares, e.g. 'http'."
        )
    if prefix is not None and not (isinstance(prefix, str) and PATH_PREFIX.match(prefix)):
        raise ServiceError(
            "endpoint.invalid",
            "'path_prefix' is one path segment, e.g. '/qwen' (letters, digits, '.', '_', "
            "'~', '-'; no trailing '/'): the gateway takes it off before the replica sees "
            "the path.",
            {"field": "path_prefix"},
        )
    if hostname is not None and not (isinstance(hostname, str) and HOSTNAME.match(hostname)):
        raise ServiceError(
            "endpoint.invalid",
            "'hostname' is a lower-case DNS name with at least one dot, e.g. 'qwen.fleet.example'.",
            {"field": "hostname"},
        )
    if prefix is None and hostname is None:
        raise ServiceError(
            "endpoint.invalid", "Give 'path_prefix', 'hostname' or both: how requests reach it."
        )
    return port, prefix, hostname


def endpoint_set(*, deployment_id: int, spec: Any, requested_by: Any = None) -> Endpoint | None:
    """Give the deployment an endpoint, change it, or (``spec`` ``None``) remove it."""
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
        if deployment is None:
            raise NotFound("deployment.not_found", f"Deployment {deployment_id} does not exist.")
        current = Endpoint.objects.filter(deployment_id=deployment_id).first()
        if deployment.deleting and spec is not None:
            raise Conflict(
                "deployment.deleting",
                f"{deployment.name} is being deleted: its workloads are stopping.",
                {"deployment": deployment_id},
            )
        if spec is None:
            if current is not None:
                current.delete()
                _record(deployment, f"Removed the endpoint of {deployment.name}", requested_by)
            return None
        port, prefix, hostname = _checked(spec)
        declared = [p["name"] for p in protocol.declared_ports(workload_of(deployment, None))]
        port = port or (current.port if current else (declared[0] if declared else None))
        if port not in declared:
            message = (
                f"{deployment.name}'s workload declares no port {port!r}"
                + (f" (it declares {', '.join(declared)})." if declared else ": it declares none.")
                + " Declare it in the workload's 'ports'."
            )
            violation = Violation("endpoint.port_unknown", message, {"declared": declared})
            raise RuleViolation(message, [violation])
        others = Endpoint.objects.exclude(deployment_id=deployment_id).select_related("deployment")
        if prefix is not None and (other := others.filter(path_prefix=prefix).first()):
            raise Conflict(
                "endpoint.taken",
                f"The path {prefix} is {other.deployment.name}'s.",
                {"deployment": other.deployment_id},
            )
        if hostname is not None and (taken := others.filter(hostname=hostname).first()):
            raise Conflict(
                "endpoint.taken",
                f"The hostname {hostname} is {taken.deployment.name}'s.",
                {"deployment": taken.deployment_id},
            )
        endpoint = current or Endpoint(deployment=deployment, slot=_free_slot())
        drain_s = _drain(spec, current)
        if current is not None and current.drain_s != drain_s:
            # The agents hold each replica's drain: send them the new one (after commit, in
            # a transaction of each host's own, so no lock order meets the deployment's).
            resend_on_commit(deployment_id)
        endpoint.port, endpoint.path_prefix, endpoint.hostname = port, prefix, hostname
        endpoint.drain_s = drain_s
        try:
            with transaction.atomic():
                endpoint.save()
        except IntegrityError as exc:  # a concurrent endpoint took the path, name or slot
            raise Conflict(
                "endpoint.taken", "Another endpoint was just given this path, name or slot: retry."
            ) from exc
        _record(
            deployment, f"Endpoint of {deployment.name}: {endpoint_url(endpoint)}", requested_by
        )
        return endpoint


def _free_slot() -> int:
    taken = set(Endpoint.objects.values_list("slot", flat=True))
    slots = int(settings.FLEET_GATEWAY_SLOTS)
    free = next((n for n in range(slots) if n not in taken), None)
    if free is None:
        raise Conflict(
            "endpoint.no_slot",
            f"Every one of the gateway's {slots} backends is taken: raise FLEET_GATEWAY_SLOTS "
            "(and restart the gateways), or remove an endpoint.",
        )
    return free


def endpoint_url(endpoint: Endpoint) -> str | None:
    """The URL a caller uses: the gateway's (``FLEET_GATEWAY_URL``) with the endpoint's host
    name and path; ``None`` when no gateway URL is set and the endpoint has no host name."""
    base = str(settings.FLEET_GATEWAY_URL or "").rstrip("/")
    path = endpoint.path_prefix or "/"
    if endpoint.hostname:
        scheme, _, rest = base.partition("://") if base else ("http", "", "")
        port = rest.rsplit(":", 1)[1] if ":" in rest.split("/")[0] else ""
        return f"{scheme}://{endpoint.hostname}{':' + port if port else ''}{path}"
    return f"{base}{path}" if base else None


def _record(deployment: Deployment, summary: str, requested_by: Any) -> None:
    operation_record(
        kind=OperationKind.SET_ENDPOINT,
        summary=summary[:255],
        requested_by=requested_by,
        status=OperationStatus.SUCCEEDED,
        deployment=deployment,
    )
    publish_changed("deployment", [deployment.pk])
