"""The data migration to one payload vocabulary (core 0019): ``phase`` becomes ``step``, a
progress log ``log``, a plan ``plan``; each child the payload named points at its parent."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from fleet.core.models import Operation

pytestmark = pytest.mark.django_db

migration = importlib.import_module("fleet.core.migrations.0019_workflow_payloads")


def _op(kind: str, payload: dict) -> Operation:
    return Operation.objects.create(kind=kind, summary=kind, payload=payload)


def test_old_payloads_speak_step_log_and_plan_and_children_point_at_their_parent():
    move = _op("move", {"step": "wait_running", "steps": [{"note": "reserved"}]})
    layout = _op("layout", {})
    defrag = _op(
        "defrag",
        {
            "steps": [
                {"kind": "move", "move": move.pk},
                {"kind": "destroy_idle", "layout": layout.pk},
            ],
            "phase": "moving",
            "index": 0,
            "log": [{"note": "plan accepted"}],
        },
    )
    repack = _op(
        "repack", {"groups": [{"gpu": 1, "steps": [], "phase": "start"}], "phase": "start"}
    )
    placed = _op("place", {"steps": ["not a workflow's"]})

    migration.forwards(apps, None)

    for row in (move, defrag, repack, placed, layout):
        row.refresh_from_db()
    assert move.payload == {"step": "wait_running", "log": [{"note": "reserved"}]}
    assert move.parent_id == defrag.pk and layout.parent_id == defrag.pk
    assert defrag.payload["step"] == "moving" and "phase" not in defrag.payload
    assert defrag.payload["plan"][0]["move"] == move.pk and "steps" not in defrag.payload
    assert repack.payload["plan"] == [{"gpu": 1, "steps": [], "step": "start"}]
    assert repack.payload["step"] == "start"
    assert placed.payload == {"steps": ["not a workflow's"]}  # only long-running kinds change


def test_the_migration_runs_twice_without_change_and_goes_back():
    defrag = _op("defrag", {"steps": [], "phase": "start", "index": 0, "log": []})
    migration.forwards(apps, None)
    defrag.refresh_from_db()
    once = defrag.payload
    migration.forwards(apps, None)
    defrag.refresh_from_db()
    assert defrag.payload == once
    migration.backwards(apps, None)
    defrag.refresh_from_db()
    assert defrag.payload == {"steps": [], "phase": "start", "index": 0, "log": []}
