"""Long-running operations' payloads in one vocabulary (fleet.workflows.engine): ``step`` where
it is (was ``phase`` in defrag and repack), ``log`` what it did (was ``steps`` in moves, drains,
host drains and rolling updates), ``plan`` what it will do (was ``steps`` in a defrag, ``groups``
in a repack); and ``Operation.parent`` filled from the child ids their payloads held."""

from __future__ import annotations

from typing import Any

from django.db import migrations

LOG_KINDS = ("move", "drain", "drain_host", "rollout")


def _renamed(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    payload = dict(payload)
    if kind in LOG_KINDS and "steps" in payload and "log" not in payload:
        payload["log"] = payload.pop("steps")
    if kind == "defrag" and "steps" in payload and "plan" not in payload:
        payload["plan"] = payload.pop("steps")
    if kind == "repack" and "groups" in payload and "plan" not in payload:
        payload["plan"] = [_group(group) for group in payload.pop("groups")]
    if kind in ("defrag", "repack") and "phase" in payload:
        payload["step"] = payload.pop("phase")
    return payload


def _group(group: dict[str, Any]) -> dict[str, Any]:
    group = dict(group)
    if "phase" in group:
        group["step"] = group.pop("phase")
    return group


def _children(kind: str, payload: dict[str, Any]) -> list[Any]:
    if kind == "defrag":
        steps = payload.get("plan", [])
    elif kind == "repack":
        steps = [s for group in payload.get("plan", []) for s in group.get("steps", [])]
    elif kind == "drain_host":
        return list(payload.get("moves", []))
    elif kind == "rollout":
        return [entry.get("move") for entry in payload.get("moving", {}).values()]
    elif kind == "layout_rollout":
        return list(payload.get("draining", {}).values())
    else:
        return []
    return [s.get(key) for s in steps for key in ("move", "layout")]


def forwards(apps: Any, schema_editor: Any) -> None:
    operation_model = apps.get_model("core", "Operation")
    kinds = (*LOG_KINDS, "defrag", "repack", "layout_rollout")
    rows = operation_model.objects.filter(kind__in=kinds).only("pk", "kind", "payload")
    for operation in rows.iterator(chunk_size=500):
        if not isinstance(operation.payload, dict):
            continue
        payload = _renamed(operation.kind, operation.payload)
        if payload != operation.payload:
            operation_model.objects.filter(pk=operation.pk).update(payload=payload)
        children = [c for c in _children(operation.kind, payload) if isinstance(c, int)]
        if children:
            found = operation_model.objects.filter(pk__in=children, parent__isnull=True)
            found.exclude(pk=operation.pk).update(parent_id=operation.pk)


def backwards(apps: Any, schema_editor: Any) -> None:
    operation_model = apps.get_model("core", "Operation")
    rows = operation_model.objects.filter(kind__in=(*LOG_KINDS, "defrag", "repack"))
    for operation in rows.only("pk", "kind", "payload").iterator(chunk_size=500):
        payload = dict(operation.payload or {})
        if operation.kind in LOG_KINDS and "log" in payload:
            payload["steps"] = payload.pop("log")
        elif operation.kind == "defrag" and "plan" in payload:
            payload["steps"] = payload.pop("plan")
            payload["phase"] = payload.pop("step", "start")
        elif operation.kind == "repack" and "plan" in payload:
            groups = [dict(g) for g in payload.pop("plan")]
            for group in groups:
                group["phase"] = group.pop("step", "start")
            payload["groups"] = groups
            payload["phase"] = payload.pop("step", "start")
        operation_model.objects.filter(pk=operation.pk).update(payload=payload)


class Migration(migrations.Migration):
    dependencies = [("core", "0018_operation_parent")]

    operations = [migrations.RunPython(forwards, backwards)]
