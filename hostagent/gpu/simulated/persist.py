"""What a simulated host keeps across an agent restart: each GPU's MIG mode (current and
pending), compute mode and MIG instances, as a real GPU keeps them until a reset or a reboot.

The file is the agent's own (its state directory, mode 0600), written atomically after every
change. Still, it is read as untrusted: a GPU whose entry is malformed, names a profile or a
placement its spec does not have, or overlaps itself starts as a fresh GPU, with a warning; an
unreadable file is ignored the same way. Processes are not kept: a simulated process is the
agent's own fiction and ends with it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hostagent.gpu.simulated.model import Gpu, GpuInstance

logger = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 1 << 20
"""A larger file is not read (a host has at most a few GPUs of 7 instances each)."""


def dump(gpus: list[Gpu]) -> dict[str, Any]:
    return {
        "version": VERSION,
        "gpus": {
            g.uuid: {
                "mig_current": g.mig_current,
                "mig_pending": g.mig_pending,
                "compute_mode": g.compute_mode,
                "created": g.created,
                "instances": [
                    {
                        "gpu_instance_id": gi.gpu_instance_id,
                        "profile_id": gi.profile["id"],
                        "start": gi.start,
                        "compute_instances": {str(k): v for k, v in gi.compute_instances.items()},
                    }
                    for gi in sorted(g.instances.values(), key=lambda i: i.gpu_instance_id)
                ],
            }
            for g in gpus
        },
    }


def save(path: Path, gpus: list[Gpu]) -> None:
    """Write the GPUs' state atomically (a crash leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(dump(gpus), out)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not keep the simulated GPUs' state in %s: %s", path, exc)


def restore(path: Path, gpus: list[Gpu]) -> None:
    """Set each GPU to its state in ``path``, where present and valid."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError("not a version 1 state file")
        entries = data.get("gpus")
        if not isinstance(entries, dict):
            raise ValueError("no 'gpus' object")
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the simulated GPUs' state in %s: %s", path, exc)
        return
    for g in gpus:
        entry = entries.get(g.uuid)
        if entry is None:
            continue
        try:
            _apply(g, entry)
        except (TypeError, ValueError, KeyError) as exc:
            logger.warning("GPU %s starts fresh: its kept state is invalid (%s)", g.uuid, exc)


def _flag(entry: dict[str, Any], key: str) -> bool:
    value = entry[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key} is not a boolean")
    return value


def _int(value: Any, what: str, low: int = 0, high: int = 1 << 20) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} is not an integer in {low}..{high}")
    return int(value)


def _apply(g: Gpu, entry: Any) -> None:
    """Validate ``entry`` whole, then set it on ``g`` (nothing set when it is invalid)."""
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    mig_current, mig_pending = _flag(entry, "mig_current"), _flag(entry, "mig_pending")
    if (mig_current or mig_pending) and not g.spec["mig_capable"]:
        raise ValueError("MIG on a GPU that is not MIG capable")
    compute_mode = entry["compute_mode"]
    if compute_mode not in ("default", "exclusive_process"):
        raise ValueError("unknown compute mode")
    created = _int(entry["created"], "created")
    raw = entry["instances"]
    if not isinstance(raw, list) or len(raw) > 7:
        raise ValueError("instances is not a list of at most 7")
    if raw and not mig_current:
        raise ValueError("MIG instances while MIG is off")
    profiles = {p["id"]: p for p in g.spec["profiles"]}
    instances: dict[int, GpuInstance] = {}
    taken: list[tuple[int, int]] = []
    compute = 0
    for item in raw:
        gi_id = _int(item["gpu_instance_id"], "gpu_instance_id", 1, 64)
        profile = profiles.get(_int(item["profile_id"], "profile_id", 0, 64))
        if profile is None or gi_id in instances:
            raise ValueError(f"GPU instance {gi_id}: unknown profile or a repeated id")
        start = _int(item["start"], "start", 0, 64)
        if [start, profile["memory_slices"]] not in [list(p) for p in profile["placements"]]:
            raise ValueError(f"GPU instance {gi_id}: no such placement")
        end = start + profile["memory_slices"]
        if any(start < e and s < end for s, e in taken):
            raise ValueError(f"GPU instance {gi_id} overlaps another")
        taken.append((start, end))
        compute += profile["compute_slices"]
        cis = item["compute_instances"]
        if not isinstance(cis, dict) or len(cis) > 1:
            raise ValueError(f"GPU instance {gi_id}: at most one compute instance")
        kept = {}
        for key, mig_uuid in cis.items():
            if key != "0" or not isinstance(mig_uuid, str) or not mig_uuid.startswith("MIG-"):
                raise ValueError(f"GPU instance {gi_id}: a bad compute instance")
            kept[0] = mig_uuid[:64]
        instances[gi_id] = GpuInstance(gi_id, profile, start, kept)
    for profile_id, profile in profiles.items():
        if (
            sum(1 for gi in instances.values() if gi.profile["id"] == profile_id)
            > profile["max_instances"]
        ):
            raise ValueError(f"more instances of profile {profile_id} than it allows")
    if compute > g.spec["compute_slice_count"]:
        raise ValueError("more compute slices than the GPU has")
    g.mig_current, g.mig_pending = mig_current, mig_pending
    g.compute_mode = compute_mode
    g.created = created
    g.instances = instances
