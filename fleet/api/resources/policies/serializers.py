"""A team's policy, for the schema (the services check the body)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.api.fields import BoundedListField
from fleet.core.policy import (
    MAX_MEMORY_MIB,
    MAX_PIDS,
    MAX_REGISTRIES,
    MAX_UID_RANGES,
    MIN_MEMORY_MIB,
    MIN_PIDS,
    RUNTIMES,
    SAFE_CAPABILITIES,
)


class PolicySerializer(serializers.Serializer[Any]):
    """For the schema: the services check the body (``policy.invalid`` names each bad key)."""

    runtimes = BoundedListField(
        child=serializers.ChoiceField(choices=[*RUNTIMES, "none"]),
        required=False,
        max_length=3,
        help_text='Workload runtimes the team may use (`none` always); default `["container"]`. '
        "`process` runs commands on the host itself: it needs `process_user`, and hosts "
        "whose agent was started with `--allow-process-runtime`.",
    )
    registries = BoundedListField(
        child=serializers.CharField(max_length=255),
        required=False,
        max_length=MAX_REGISTRIES,
        help_text="Image prefixes ending in `/` (`registry.example.com/team-a/`, "
        "`docker.io/library/`) or repositories (`docker.io/library/python`) a container's "
        "image must come from; `python:3.11` reads as `docker.io/library/python:3.11`. "
        "Default `[]`: any registry.",
    )
    uids = BoundedListField(
        child=BoundedListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        required=False,
        max_length=MAX_UID_RANGES,
        help_text="`[[lo, hi], ...]`: the uids a workload's `user` may be (numeric `uid[:gid]` "
        "then); default `[[1000, 2147483647]]`; `[]`: any user but root.",
    )
    allow_root = serializers.BooleanField(
        required=False, help_text="uid 0 (`root`, `0:0`) may run; default false."
    )
    process_user = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=64,
        help_text="The `uid[:gid]` every process workload runs as; required with the `process` "
        "runtime, non-root unless `allow_root`.",
    )
    capabilities = BoundedListField(
        child=serializers.ChoiceField(choices=sorted(SAFE_CAPABILITIES)),
        required=False,
        max_length=len(SAFE_CAPABILITIES),
        help_text="Linux capabilities added back after dropping all of them; default `[]`.",
    )
    max_host_memory_mib = serializers.IntegerField(
        required=False,
        min_value=MIN_MEMORY_MIB,
        max_value=MAX_MEMORY_MIB,
        help_text="The most host memory a deployment may ask for (`host_memory_mib`); "
        "default 65536.",
    )
    default_host_memory_mib = serializers.IntegerField(
        required=False,
        min_value=MIN_MEMORY_MIB,
        max_value=MAX_MEMORY_MIB,
        help_text="A replica's host memory limit when its deployment asks for none; default 16384.",
    )
    max_pids = serializers.IntegerField(
        required=False,
        min_value=MIN_PIDS,
        max_value=MAX_PIDS,
        help_text="Each replica's PID limit; default 4096.",
    )
    host_network = serializers.BooleanField(
        required=False,
        help_text="Containers use the host's network; default false.",
    )
