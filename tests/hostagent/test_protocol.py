from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    {
        "type": "desired_state",
        "generation": 5,
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
                        "key": "a7:llm[0]",
                        "gpu_uuid": "GPU-1",
                        "partition_key": "p1",
                        "memory_mib": None,
                        "max_compute_percent": None,
                        "allocation_id": 7,
                        "deployment": "llm",
                        "replica": 0,
                        "workload": {
                            "runtime": "container",
                            "image": "registry.example/llm:1.2",
                            "command": ["serve", "--port", "8000"],
                            "env": {"MODEL": "qwen-7b"},
                            "cwd": None,
                            "user": None,
                            "restart": "always",
                            "stop_grace_s": 30,
                            "health": {
                                "http": {"port": 8000, "path": "/health"},
                                "interval_s": 10,
                                "timeout_s": 3,
                                "retries": 3,
                                "start_period_s": 0,
                            },
                        },
                    }
                ],
            }
        },
    },
    {
        "type": "workloads",
        "ts": 4.0,
        "full": True,
        "workloads": [
            {
                "allocation_id": 7,
                "state": "running",
                "started_at": 3.5,
                "exit_code": None,
                "restarts": 0,
                "message": "",
                "pids": [4],
            }
        ],
    },
    {"type": "ping", "nonce": "n1"},
    {"type": "pong", "nonce": "n1", "ts": 3.0},
    {"type": "logs_request", "request_id": "r1", "allocation_id": 7, "tail": 200},
    {
        "type": "logs",
        "request_id": "r1",
        "allocation_id": 7,
        "lines": ["ready", ""],
        "truncated": False,
        "error": None,
    },
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: str(m["type"]))
def test_every_message_round_trips_through_encode_and_decode(msg):
    assert protocol.decode(protocol.encode(msg)) == msg


def test_unknown_keys_are_dropped_before_anything_can_store_or_forward_them():
    decoded = protocol.decode('{"type":"ping","nonce":"x","extra":[[[1]]]}')
    assert decoded == {"type": "ping", "nonce": "x"}
    telemetry = json.loads(protocol.encode(MESSAGES[1]))
    telemetry["gpus"][0]["x"] = {"deep": [1, 2]}
    telemetry["gpus"][0]["mig"][0]["y"] = 1
    assert protocol.validate_message(telemetry) == MESSAGES[1]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"type":"nope"}', "unknown message type"),
        ('{"nonce":"x"}', "unknown message type"),
        ('{"type":"ping"}', "missing required field `nonce`"),
        ('{"type":"ping","nonce":1}', "$.nonce"),
        (
            '{"type":"event","kind":"fire","gpu_uuid":"g","gpu_instance_id":null,'
            '"xid":null,"detail":"","ts":1}',
            "$.kind",
        ),
        ('{"type":"telemetry","ts":true,"gpus":[]}', "$.ts"),
        ('{"type":"desired_state","generation":1,"gpus":{"g":{"mode":"mig"}}}', "$.gpus[...]"),
        ('{"type":"desired_state","generation":1.5,"gpus":{}}', "$.generation"),
        ("[" * 100_000 + "]" * 100_000, "JSON object"),
        ('{"a":' * 5000 + "1" + "}" * 5000, "nested too deeply"),
        ('{"type":"ping","nonce":"x","z":' + "[" * 5000 + "]" * 5000 + "}", "nested too deeply"),
    ],
)
def test_malformed_messages_raise_protocol_error(text, where):
    with pytest.raises(ProtocolError, match=re.escape(where)):
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


# -- bounds: every field replaced by extremes ---------------------------------------------------

DEEP: dict = {"x": 1}
for _ in range(300):
    DEEP = {"x": [DEEP]}
EXTREMES = [
    1e308,
    -1e308,
    2**63,
    2**64,
    -1,
    -(2**63),
    1.5,
    None,
    True,
    "",
    "x" * 10_000,
    [],
    [[0]],
    [[0, 1, 2]],
    {},
    DEEP,
]


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


def _outcome(variant):
    """Decode a variant: a ProtocolError, or a message that survives its own round trip."""
    text = json.dumps(variant)
    try:
        decoded = protocol.decode(text)
    except ProtocolError:
        return "refused"
    assert protocol.decode(protocol.encode(decoded)) == decoded
    assert protocol.validate_message(json.loads(text)) == decoded
    return "accepted"


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: str(m["type"]))
def test_every_field_replaced_by_an_extreme_is_refused_or_bounded(msg):
    outcomes = {"refused": 0, "accepted": 0}
    for path, _ in _paths(msg):
        if path == ("type",):
            continue
        for odd in EXTREMES:
            outcomes[_outcome(_with(msg, path, odd))] += 1
    assert outcomes["refused"] > 10


@given(data=st.data())
@settings(max_examples=300, deadline=None)
def test_several_fields_replaced_at_once_never_raise_anything_but_protocol_error(data):
    msg = data.draw(st.sampled_from(MESSAGES))
    paths = [p for p, _ in _paths(msg) if p and p != ("type",)]
    variant = msg
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(paths))
        try:
            variant = _with(variant, path, data.draw(st.sampled_from(EXTREMES)))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed this path
    _outcome(variant)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda g: g.update(uuid="x" * 97), "$.gpus[0].uuid"),
        (lambda g: g["mig_instances"].append(dict(g["mig_instances"][0])), "duplicate"),
        (
            lambda g: g["mig_instances"].append(
                {**g["mig_instances"][0], "gpu_instance_id": 2, "start": 5, "size": 1}
            ),
            "overlaps",
        ),
        (lambda g: g["possible_placements"]["9"]["placements"].append([0]), "$.gpus[0]"),
        (lambda g: g["possible_placements"]["9"]["placements"].append([14, 4]), "grid"),
        (lambda g: g["possible_placements"].update(x=g["possible_placements"]["9"]), "$.gpus[0]"),
        (lambda g: g["possible_placements"].update({"10": g["possible_placements"]["9"]}), "key"),
        (lambda g: g.update(name="n" * 257), "$.gpus[0].name"),
    ],
)
def test_a_hello_with_a_malformed_gpu_is_refused(change, why):
    hello = json.loads(protocol.encode(MESSAGES[0]))
    change(hello["gpus"][0])
    with pytest.raises(ProtocolError, match=re.escape(why)):
        protocol.validate_message(hello)


def test_a_telemetry_frame_repeating_a_gpu_is_refused():
    telemetry = json.loads(protocol.encode(MESSAGES[1]))
    telemetry["gpus"].append(telemetry["gpus"][0])
    with pytest.raises(ProtocolError, match="duplicate GPU uuid"):
        protocol.validate_message(telemetry)


def test_more_gpus_than_the_server_allows_are_refused():
    telemetry = json.loads(protocol.encode(MESSAGES[1]))
    telemetry["gpus"] = [dict(telemetry["gpus"][0], uuid=f"GPU-{i}") for i in range(65)]
    with pytest.raises(ProtocolError, match="more than 64 GPUs"):
        protocol.validate_message(telemetry)
    assert protocol.validate_message(telemetry, max_gpus=65)["type"] == "telemetry"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("utilization_gpu_percent", 100.5),
        ("utilization_gpu_percent", -0.1),
        ("temperature_c", 151),
        ("temperature_c", -51),
        ("memory_used_mib", 2**32 + 1),
        ("power_mw", 10**7 + 1),
        ("ecc_corrected", -1),
    ],
)
def test_telemetry_values_out_of_their_physical_range_are_refused(field, value):
    telemetry = json.loads(protocol.encode(MESSAGES[1]))
    telemetry["gpus"][0][field] = value
    with pytest.raises(ProtocolError, match=re.escape(f"$.gpus[0].{field}")):
        protocol.validate_message(telemetry)


def test_clip_keeps_text_within_the_protocol_limit():
    assert protocol.clip("short") == "short"
    clipped = protocol.clip("y" * 1000)
    assert len(clipped) == protocol.MAX_TEXT and clipped.endswith("…")


def test_a_string_holding_nul_is_refused_and_an_escaped_backslash_before_u0000_is_not():
    hello = dict(MESSAGES[0])
    hello["agent_version"] = "1.0\x00"
    text = json.dumps(hello)
    for raw in (text, text.encode()):
        with pytest.raises(ProtocolError, match="U\\+0000"):
            protocol.decode(raw)
    hello["agent_version"] = "1.0\\u0000"  # a backslash, then the text u0000: no NUL
    assert protocol.decode(json.dumps(hello))["agent_version"] == "1.0\\u0000"
