from __future__ import annotations

import json

import pytest

from hostagent import protocol
from hostagent.protocol import ProtocolError
from tests.hostagent import specs


def _gpu_info() -> protocol.GpuInfo:
    return {
        "index": 0,
        "uuid": "GPU-1",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_device_id": 0x233010DE,
        "memory_total_mib": 81559,
        "mig_capable": True,
        "mig_mode_current": True,
        "mig_mode_pending": True,
        "status": "ok",
        "possible_placements": {
            "9": {
                "profile_id": 9,
                "name": "3g.40gb",
                "compute_slices": 3,
                "memory_slices": 4,
                "memory_mib": 40448,
                "max_instances": 2,
                "placements": [[0, 4], [4, 4]],
            }
        },
        "mig_instances": [
            {
                "gpu_instance_id": 1,
                "compute_instance_id": 0,
                "profile_id": 9,
                "start": 4,
                "size": 4,
                "uuid": "MIG-1",
                "memory_mib": 40448,
            }
        ],
        "mps": protocol.empty_mps_state(),
    }


MESSAGES: list[protocol.Message] = [
    {
        "type": "hello",
        "protocol": protocol.PROTOCOL_VERSION,
        "agent_version": "0.1.0",
        "hostname": "gpu-01",
        "backend": "simulated",
        "allow_mutation": False,
        "driver_version": "580.65.06",
        "nvml_version": None,
        "applied_generation": 3,
        "gpus": [_gpu_info()],
    },
    {
        "type": "telemetry",
        "ts": 1.5,
        "gpus": [
            {
                "uuid": "GPU-1",
                "status": "ok",
                "utilization_gpu_percent": None,
                "memory_used_mib": 10,
                "memory_total_mib": 81559,
                "temperature_c": 40,
                "power_mw": None,
                "ecc_corrected": 0,
                "ecc_uncorrected": None,
                "processes": [
                    {
                        "pid": 4,
                        "used_memory_mib": None,
                        "gpu_instance_id": 1,
                        "compute_instance_id": 0,
                    }
                ],
                "mig": [
                    {
                        "gpu_instance_id": 1,
                        "compute_instance_id": 0,
                        "uuid": "MIG-1",
                        "utilization_percent": 12.5,
                        "memory_used_mib": None,
                        "memory_total_mib": 40448,
                    }
                ],
            }
        ],
    },
    {
        "type": "event",
        "kind": "xid",
        "gpu_uuid": "GPU-1",
        "gpu_instance_id": None,
        "xid": 79,
        "detail": "Xid 79",
        "ts": 2,
    },
    {
        "type": "ack",
        "generation": 3,
        "status": "partial",
        "items": [
            {"key": "a", "gpu_uuid": "GPU-1", "status": "in_use", "message": "", "pids": [4]}
        ],
        "observed": [_gpu_info()],
    },
    {
        "type": "desired_state",
        "generation": 4,
        "gpus": {
            "GPU-1": {
                "mode": "mig",
                "mig_enabled": True,
                "instances": [{"key": "p1", "profile_id": 9, "start": 0}],
                "mps": {
                    "enabled": False,
                    "per_instance": False,
                    "default_active_thread_percentage": None,
                    "default_pinned_mem_limit_mib": None,
                },
                "allocations": [
                    {
                        "key": "alloc-1",
                        "gpu_uuid": "GPU-1",
                        "partition_key": "p1",
                        "memory_mib": None,
                        "max_compute_percent": None,
                    }
                ],
            }
        },
    },
    {"type": "ping", "nonce": "n1"},
    {"type": "pong", "nonce": "n1", "ts": 3.0},
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: str(m["type"]))
def test_every_message_round_trips_through_encode_and_decode(msg):
    assert protocol.decode(protocol.encode(msg)) == msg


def test_unknown_keys_are_kept_for_forward_compatibility():
    assert protocol.decode('{"type":"ping","nonce":"x","extra":1}')["extra"] == 1  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"type":"nope"}', "unknown message type"),
        ('{"nonce":"x"}', "unknown message type"),
        ('{"type":"ping"}', "missing key 'nonce'"),
        ('{"type":"ping","nonce":1}', "$.nonce"),
        (
            '{"type":"event","kind":"fire","gpu_uuid":"g","gpu_instance_id":null,'
            '"xid":null,"detail":"","ts":1}',
            "$.kind",
        ),
        ('{"type":"telemetry","ts":true,"gpus":[]}', "$.ts"),
        ('{"type":"desired_state","generation":1,"gpus":{"g":{"mode":"mig"}}}', "$.gpus.g"),
        ('{"type":"desired_state","generation":1.5,"gpus":{}}', "$.generation"),
    ],
)
def test_malformed_messages_raise_protocol_error(text, where):
    with pytest.raises(ProtocolError, match=where.replace("$", r"\$").replace("(", r"\(")):
        protocol.decode(text)


def test_booleans_are_not_accepted_as_integers():
    bad = json.loads(protocol.encode(MESSAGES[2]))
    bad["xid"] = True
    with pytest.raises(ProtocolError, match=r"\$\.xid"):
        protocol.validate_message(bad)


def test_encode_refuses_an_invalid_message():
    with pytest.raises(ProtocolError):
        protocol.encode({"type": "ping"})  # type: ignore[typeddict-item]


@pytest.mark.parametrize("spec", [specs.h100(), specs.a100(), specs.a30(), specs.l4()])
def test_simulated_gpu_specs_validate(spec):
    protocol.validate(spec, protocol.SimulatedGpuSpec)


def test_ack_status_summarises_item_results():
    ok = {"key": "a", "gpu_uuid": "g", "status": "ok", "message": "", "pids": []}
    bad = {**ok, "status": "in_use"}
    assert protocol.ack_status([]) == "applied"
    assert protocol.ack_status([ok, ok]) == "applied"  # type: ignore[list-item]
    assert protocol.ack_status([ok, bad]) == "partial"  # type: ignore[list-item]
    assert protocol.ack_status([bad]) == "failed"  # type: ignore[list-item]


def test_auth_header_uses_the_token_scheme():
    assert protocol.auth_header_value("abc") == "Token abc"


# -- the compiled predicates agree with the interpreting checker ------------------------------

_ODD_VALUES = [None, True, False, 0, -1, 2**40, 1.5, float("inf"), "", "x", [], [1], {}, {"k": 1}]


def _paths(value, path=()):
    """Every (path, value) inside a JSON value, the value itself included."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _with(value, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


def _without(value, path):
    copy = json.loads(json.dumps(value))
    target = copy
    for step in path[:-1]:
        target = target[step]
    if isinstance(target, dict):
        del target[path[-1]]
    else:
        target.pop(path[-1])
    return copy


def _interpreted_ok(obj, td) -> bool:
    try:
        protocol._check_typeddict(obj, td, "$")
    except ProtocolError:
        return False
    return True


def _variants(msg):
    """The message with each value in turn replaced by each odd value, and each key removed."""
    for path, _ in _paths(msg):
        for odd in _ODD_VALUES:
            yield _with(msg, path, odd)
        if path:
            yield _without(msg, path)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: str(m["type"]))
def test_the_compiled_validator_agrees_with_the_interpreting_one(msg):
    td = protocol.MESSAGE_TYPES[msg["type"]]
    checked = 0
    for variant in _variants(msg):
        fast = protocol.is_valid(variant, td)
        assert fast == _interpreted_ok(variant, td), variant
        if not fast:
            with pytest.raises(ProtocolError):
                protocol.validate(variant, td)
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("spec", [specs.h100(), specs.a30()])
def test_the_compiled_validator_agrees_on_gpu_specs(spec):
    for variant in _variants(spec):
        assert protocol.is_valid(variant, protocol.SimulatedGpuSpec) == _interpreted_ok(
            variant, protocol.SimulatedGpuSpec
        )
