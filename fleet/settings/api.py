"""The REST API: Django REST framework (authentication, permissions, pagination, errors,
throttles) and the OpenAPI schema (drf-spectacular)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from fleet.settings.env import env, env_int
from fleet.settings.mode import DEBUG


def _throttle_rate(name: str, default: str) -> str:
    """A DRF rate such as ``120/min`` from ``name``; a malformed one stops the start."""
    rate = env(name, default)
    count, _, period = rate.partition("/")
    if not (count.isdecimal() and period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(f"{name} must look like 120/min (per s, min, hour or day)")
    return rate


REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.core.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["fleet.core.permissions.RolePermission"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "fleet.api.pagination.BoundedPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "fleet.core.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "fleet.api.schema.LimitedAutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "fleet.api.negotiation.Negotiation",
    "DEFAULT_PARSER_CLASSES": ["fleet.api.parsers.JsonParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Throttles (fleet.api.limits): per user, per agent host, per client address, and per view
    # scope. Rates are "<count>/<s|min|hour|day>"; the defaults leave people and scripts alone
    # and stop a loop. The client address is the NUM_PROXIES-th from the right of
    # X-Forwarded-For (0: the socket's peer; set it to the number of reverse proxies).
    "DEFAULT_THROTTLE_CLASSES": [
        "fleet.api.limits.UserThrottle",
        "fleet.api.limits.AgentThrottle",
        "fleet.api.limits.AnonThrottle",
        "fleet.api.limits.ScopedThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "user": _throttle_rate("FLEET_THROTTLE_USER", "1200/min"),
        "agent": _throttle_rate("FLEET_THROTTLE_AGENT", "600/min"),
        "anon": _throttle_rate("FLEET_THROTTLE_ANON", "120/min"),
        "enroll": _throttle_rate("FLEET_THROTTLE_ENROLL", "30/min"),
        "mig": _throttle_rate("FLEET_THROTTLE_MIG", "300/min"),
        "expensive": _throttle_rate("FLEET_THROTTLE_EXPENSIVE", "60/min"),
    },
    "NUM_PROXIES": env_int("FLEET_NUM_PROXIES", 0),
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append(
        "rest_framework.renderers.BrowsableAPIRenderer"
    )

SPECTACULAR_SETTINGS = {
    "TITLE": "Fleet API",
    "DESCRIPTION": (
        "Inventory, MIG layouts, MPS policies, deployments and placements of a fleet of NVIDIA "
        "GPU hosts. Authenticate with `Authorization: Token <key>` (scripts) or a session "
        "(browser). Every error is `{code, message, details}`."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI comes from the drf-spectacular-sidecar package (PyPI), never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # The schema and the docs are for users holding a role, like the API they describe.
    "SERVE_PERMISSIONS": ["fleet.core.permissions.RolePermission"],
    "ENUM_NAME_OVERRIDES": {
        "HostStatusEnum": "fleet.inventory.models.HostStatus",
        "SharingModeEnum": "fleet.inventory.models.SharingMode",
        "AgentRuntimeEnum": "fleet.inventory.models.AgentRuntime",
        "WorkloadRuntimeEnum": ["container", "process", "none"],
        "GpuHealthEnum": "fleet.inventory.models.GpuHealth",
        "PartitionKindEnum": "fleet.partitioning.models.PartitionKind",
        "OperationKindEnum": "fleet.core.models.OperationKind",
        "OperationStatusEnum": "fleet.core.models.OperationStatus",
        "RequestKindEnum": "fleet.allocations.models.RequestKind",
        "AllocationStateEnum": "fleet.allocations.models.AllocationState",
        "DeploymentStatusEnum": "fleet.allocations.states.DeploymentStatus",
    },
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums"],
}
