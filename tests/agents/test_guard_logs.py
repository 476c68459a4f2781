"""The guard checks a ``logs`` answer like every other up-message, and refuses the server's
own ``logs_request`` coming up."""

from __future__ import annotations

import json

import pytest

from fleet.agents.guard import AgentGuard, Refused, admit_parsed


def _answer(**changes: object) -> dict[str, object]:
    return {
        "type": "logs",
        "request_id": "abc",
        "allocation_id": 4,
        "lines": ["hello"],
        "truncated": False,
        "error": None,
        **changes,
    }


def test_a_logs_answer_is_admitted_with_its_unknown_keys_dropped():
    admitted = AgentGuard().admit(json.dumps(_answer(extra={"x": 1})))
    assert admitted == _answer()
    assert admit_parsed(_answer(extra=1)) == _answer()


@pytest.mark.parametrize(
    "change",
    [
        {"lines": ["x" * 5000]},
        {"lines": ["x"] * 5001},
        {"lines": "not a list"},
        {"truncated": None},
        {"request_id": "r" * 65},
        {"allocation_id": -1},
    ],
)
def test_a_logs_answer_out_of_its_bounds_is_refused(change):
    with pytest.raises(Refused) as refused:
        AgentGuard().admit(json.dumps(_answer(**change)))
    assert refused.value.reason == "invalid"


def test_an_answer_over_the_frame_limit_is_refused_unread(settings):
    settings.FLEET_AGENT_MAX_MESSAGE_BYTES = 1000
    with pytest.raises(Refused) as refused:
        AgentGuard().admit(json.dumps(_answer(lines=["y" * 100] * 20)))
    assert refused.value.reason == "too_large"


def test_an_agent_cannot_send_a_logs_request():
    request = {"type": "logs_request", "request_id": "r", "allocation_id": 1, "tail": 5}
    with pytest.raises(Refused):
        AgentGuard().admit(json.dumps(request))
