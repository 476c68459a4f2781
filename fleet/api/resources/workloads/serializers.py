"""What replicas run (a deployment's ``workload``), as the API takes it and reads it.

The shape, bounds and defaults come from the wire contract (``hostagent.protocol.workloads``;
``tests/api/test_protocol_mirrors.py`` holds them field for field); the rules a type cannot say
(the image grammar, reserved variables, one probe per health check) are checked by the service
with the protocol's own function, so the API, the service and the agent agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from fleet.api.fields import BoundedDictField, BoundedListField
from fleet.core.secrets import NAME_PATTERN, NAME_RULE, secret_ref
from hostagent import protocol

# Every field's default, from the one place that says it: a field left out of a body gets what the
# agent would assume (``hostagent.protocol.default_workload`` and ``default_health``).
WORKLOAD_DEFAULTS = protocol.default_workload()
HEALTH_DEFAULTS = protocol.default_health()


class _Strict(serializers.Serializer[Any]):
    """Refuses keys it does not know: a typo (``imge``) must not be silently ignored."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(dict.fromkeys(unknown[:20], "Unknown field."))
        return super().to_internal_value(data)


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": protocol.MAX_ARG_CHARS},
            {
                "type": "object",
                "properties": {"secret": {"type": "string", "pattern": NAME_PATTERN.pattern}},
                "required": ["secret"],
                "additionalProperties": False,
            },
        ]
    }
)
class EnvValueField(serializers.Field):  # type: ignore[type-arg]
    """An env value: a string, or ``{"secret": "<name>"}``, a reference to one of the
    deployment's team's secrets (the agent gets its value; reads show the reference)."""

    default_error_messages = {
        "invalid": 'A string, or {"secret": "<name>"} naming one of the team\'s secrets '
        f"({NAME_RULE}).",
        "too_long": f"At most {protocol.MAX_ARG_CHARS} characters.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and len(data) <= protocol.MAX_ARG_CHARS:
            return data
        name = secret_ref(data)
        if name is not None and NAME_PATTERN.match(name):
            return {"secret": name}
        code = "too_long" if isinstance(data, str) else "invalid"
        raise serializers.ValidationError(self.error_messages[code], code=code)

    def to_representation(self, value: Any) -> Any:
        return value


class HttpCheckSerializer(_Strict):
    port = serializers.IntegerField(min_value=1, max_value=65535)
    path = serializers.CharField(max_length=protocol.MAX_TEXT, default="/")


class TcpCheckSerializer(_Strict):
    port = serializers.IntegerField(min_value=1, max_value=65535)


class ExecCheckSerializer(_Strict):
    command = BoundedListField(
        child=serializers.CharField(max_length=protocol.MAX_ARG_CHARS, trim_whitespace=False),
        min_length=1,
        max_length=protocol.MAX_ARGS,
    )


class HealthCheckSerializer(_Strict):
    """Exactly one of ``http``, ``tcp``, ``exec``; a replica is *running* once it passes."""

    http = HttpCheckSerializer(
        required=False, help_text="GET http://127.0.0.1:port/path → 2xx/3xx."
    )
    tcp = TcpCheckSerializer(required=False, help_text="127.0.0.1:port accepts a connection.")
    exec = ExecCheckSerializer(required=False, help_text="The command exits 0.")
    interval_s = serializers.IntegerField(
        default=HEALTH_DEFAULTS["interval_s"], min_value=1, max_value=3600
    )
    timeout_s = serializers.IntegerField(
        default=HEALTH_DEFAULTS["timeout_s"], min_value=1, max_value=600
    )
    retries = serializers.IntegerField(
        default=HEALTH_DEFAULTS["retries"],
        min_value=1,
        max_value=100,
        help_text="Failures in a row that restart it.",
    )
    start_period_s = serializers.IntegerField(
        default=HEALTH_DEFAULTS["start_period_s"],
        min_value=0,
        max_value=3600,
        help_text="Failures in this first time do not count.",
    )


class WorkloadPortSerializer(_Strict):
    """A port the workload listens on; each replica gets a host port of its own for it."""

    name = serializers.RegexField(
        protocol.PORT_NAME_PATTERN,
        max_length=15,
        help_text="Lower case, digits and `_` (`FLEET_PORT_<NAME>` in the environment).",
    )
    port = serializers.IntegerField(
        min_value=1,
        max_value=65535,
        help_text="The port the program listens on in its container (a process listens on "
        "`FLEET_PORT_<NAME>`, its host port).",
    )


class WorkloadSerializer(_Strict):
    """What each replica runs on its slice. ``none`` (the default) runs nothing: the slice is
    reserved and an outside launcher reads the allocation's ``environment``."""

    runtime = serializers.ChoiceField(
        choices=list(get_args(protocol.WorkloadRuntime)), default=WORKLOAD_DEFAULTS["runtime"]
    )
    image = serializers.CharField(
        max_length=protocol.MAX_IMAGE_CHARS,
        required=False,
        allow_null=True,
        default=WORKLOAD_DEFAULTS["image"],
        help_text="Container image reference, `[registry/]name[:tag][@digest]`.",
    )
    command = BoundedListField(
        child=serializers.CharField(max_length=protocol.MAX_ARG_CHARS, trim_whitespace=False),
        max_length=protocol.MAX_ARGS,
        default=lambda: list(WORKLOAD_DEFAULTS["command"]),
        help_text="Arguments (a container's image command when empty).",
    )
    env = BoundedDictField(
        max_entries=protocol.MAX_ENV,
        child=EnvValueField(),
        default=lambda: dict(WORKLOAD_DEFAULTS["env"]),
        help_text=f"At most {protocol.MAX_ENV}; no CUDA_*, NVIDIA_* or FLEET_* device variables "
        '(Fleet sets those). A value is a string, or `{"secret": "<name>"}`: a secret of the '
        "deployment's team (`/teams/{id}/secrets`; else 422 `secret.not_found`), whose value "
        "only the agent running the replica receives.",
    )
    cwd = serializers.CharField(
        max_length=protocol.MAX_TEXT,
        required=False,
        allow_null=True,
        default=WORKLOAD_DEFAULTS["cwd"],
    )
    user = serializers.CharField(
        max_length=protocol.MAX_TEXT,
        required=False,
        allow_null=True,
        default=WORKLOAD_DEFAULTS["user"],
        help_text="User name or uid, optionally `:group`.",
    )
    restart = serializers.ChoiceField(
        choices=list(get_args(protocol.RestartPolicy)), default=WORKLOAD_DEFAULTS["restart"]
    )
    stop_grace_s = serializers.IntegerField(
        default=WORKLOAD_DEFAULTS["stop_grace_s"],
        min_value=0,
        max_value=protocol.MAX_STOP_GRACE_S,
        help_text="SIGTERM, then SIGKILL after this many seconds.",
    )
    health = HealthCheckSerializer(
        required=False, allow_null=True, default=WORKLOAD_DEFAULTS["health"]
    )
    ports = BoundedListField(
        child=WorkloadPortSerializer(),
        max_length=protocol.MAX_PORTS,
        default=lambda: list(WORKLOAD_DEFAULTS.get("ports", [])),
        help_text=f"At most {protocol.MAX_PORTS}, names and ports unique. Each replica gets a "
        "host port of its own per port (the allocation's `ports`); an http or tcp health "
        "check's port that is not declared is declared as `health`.",
    )


@extend_schema_serializer(component_name="ImagePin")
class ImagePinSerializer(serializers.Serializer[Any]):
    """A container image's pin: the digest its registry served when the workload was set."""

    image = serializers.CharField(help_text="The image as given (its tag).")
    reference = serializers.CharField(
        allow_null=True,
        help_text="`name@sha256:…`, what the agents pull; `null`: they pull the tag (`reason`).",
    )
    reason = serializers.CharField(
        help_text="Why the tag was kept (no registry answered, a private address, credentials "
        "wanted, no such tag); empty when pinned."
    )
    at = serializers.DateTimeField(help_text="When the registry was asked.")


class WorkloadReadSerializer(WorkloadSerializer):
    """What each replica runs on its slice, as the API answers it: in full (``redacted:
    false``), or, for a reader outside the deployment's team without a fleet role, only its
    ``runtime`` with ``redacted: true``."""

    image_pin = ImagePinSerializer(
        read_only=True,
        allow_null=True,
        help_text="A container's image pinned to its digest at create or rolling update "
        "(`null` for other runtimes and for workloads set before pinning).",
    )
    redacted = serializers.BooleanField(
        read_only=True,
        help_text="true: another team's workload, of which only `runtime` is shown (its team's "
        "members and fleet viewers and up read it all).",
    )

    def to_representation(self, instance: Any) -> Any:
        if isinstance(instance, Mapping) and instance.get("redacted") is True:
            return dict(instance)
        return {"image_pin": None, **super().to_representation(instance), "redacted": False}
