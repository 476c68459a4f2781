"""Each DRF serializer that mirrors a TypedDict (the agent's wire contract in
``hostagent.protocol``, the payloads the apps answer with) holds exactly its fields, with the
same nullability, so the API cannot drift from what the agent and the services say: a field added
to one and not the other fails here. The workload serializer's defaults are the protocol's."""

from __future__ import annotations

import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from rest_framework import serializers

from fleet.allocations.accounting import telemetry
from fleet.allocations.planning import advice, capacity
from fleet.api.resources.allocations import serializers as allocations
from fleet.api.resources.capacity import serializers as cap
from fleet.api.resources.policies.serializers import PolicySerializer
from fleet.api.resources.workloads import serializers as workloads
from fleet.core.policy import Policy
from fleet.inventory.telemetry.replicas import ReplicaPoint
from hostagent import protocol

MIRRORS: list[tuple[type[Any], type[serializers.Serializer[Any]]]] = [
    (protocol.Workload, workloads.WorkloadSerializer),
    (protocol.HealthCheck, workloads.HealthCheckSerializer),
    (protocol.HttpCheck, workloads.HttpCheckSerializer),
    (protocol.TcpCheck, workloads.TcpCheckSerializer),
    (protocol.ExecCheck, workloads.ExecCheckSerializer),
    (protocol.PortSpec, workloads.WorkloadPortSerializer),
    (capacity.CapacityPayload, cap.CapacitySerializer),
    (capacity.ProductPayload, cap.CapacityProductSerializer),
    (capacity.ProfilePayload, cap.CapacityProfileSerializer),
    (capacity.MigPayload, cap.CapacityMigSerializer),
    (capacity.MpsPayload, cap.CapacityMpsSerializer),
    (capacity.WholePayload, cap.CapacityWholeSerializer),
    (capacity.HostPayload, cap.CapacityHostSerializer),
    (capacity.FragmentationPayload, cap.CapacityFragmentationSerializer),
    (capacity.RequestProductPayload, cap.CapacityRequestProductSerializer),
    (capacity.RequestPayload, cap.CapacityRequestSerializer),
    (advice.AdvicePayload, cap.AdviceSerializer),
    (advice.SolverPayload, cap.AdviceSolverSerializer),
    (advice.WaitingPayload, cap.AdviceWaitingSerializer),
    (advice.PlacePayload, cap.AdvicePlaceSerializer),
    (advice.InstancePayload, cap.AdviceInstanceSerializer),
    (advice.GpuPayload, cap.AdviceGpuSerializer),
    (telemetry.ReplicaSeries, allocations.ReplicaMetricsSerializer),
    (ReplicaPoint, allocations.ReplicaPointSerializer),
    (Policy, PolicySerializer),
]


def _ids(pair: tuple[type[Any], type[Any]]) -> str:
    return f"{pair[0].__name__}-{pair[1].__name__}"


def _nullable(hint: Any) -> bool:
    if get_origin(hint) is typing.Annotated:
        return _nullable(get_args(hint)[0])
    if get_origin(hint) in (Union, types.UnionType):
        return type(None) in get_args(hint)
    return hint is type(None)


@pytest.mark.parametrize("pair", MIRRORS, ids=_ids)
def test_the_serializer_has_the_fields_of_the_typed_dict_it_mirrors(pair: Any) -> None:
    typed_dict, serializer = pair
    keys = typed_dict.__required_keys__ | typed_dict.__optional_keys__
    assert set(serializer().fields) == set(keys)


@pytest.mark.parametrize("pair", MIRRORS, ids=_ids)
def test_a_field_is_nullable_in_the_serializer_exactly_when_it_is_in_the_typed_dict(
    pair: Any,
) -> None:
    typed_dict, serializer = pair
    hints = get_type_hints(typed_dict, include_extras=True)
    fields = serializer().fields
    nullable = {name for name, hint in hints.items() if _nullable(hint)}
    assert {name for name, field in fields.items() if field.allow_null} == nullable


def test_a_workload_left_empty_gets_the_protocol_default_of_every_field() -> None:
    body = workloads.WorkloadSerializer(data={})
    assert body.is_valid(), body.errors
    assert dict(body.validated_data) == protocol.default_workload()


def test_a_health_check_gets_the_protocol_defaults() -> None:
    body = workloads.HealthCheckSerializer(data={"tcp": {"port": 8000}})
    assert body.is_valid(), body.errors
    assert {k: body.validated_data[k] for k in protocol.default_health()} == (
        protocol.default_health()
    )


def test_the_defaults_do_not_share_a_list_between_bodies() -> None:
    first = workloads.WorkloadSerializer(data={})
    second = workloads.WorkloadSerializer(data={})
    assert first.is_valid() and second.is_valid()
    first.validated_data["command"].append("x")
    assert second.validated_data["command"] == []
    assert protocol.default_workload()["command"] == []
