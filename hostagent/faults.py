"""Fault injection into a running simulated agent, for end-to-end and health tests.

``fleet-agent --simulate … --fault-dir DIR`` watches DIR; every ``*.json`` file dropped there is
one command for the :class:`~hostagent.gpu.simulated.SimulatedBackend`, applied and deleted:

``{"fault": "xid", "gpu": 0, "xid": 79}``, ``{"fault": "ecc", "gpu": 0, "uncorrected": 1}``,
``{"fault": "lose_gpu", "gpu": 0}``, ``{"fault": "restore_gpu", "gpu": 0}``,
``{"fault": "crash_mps", "gpu": 0}``, ``{"fault": "slow_apply", "seconds": 3}``,
``{"fault": "reset_gpu", "gpu": 0}`` (a GPU reset forced from outside, as a reboot: MIG
instances, processes and MPS daemons gone, a pending MIG mode applied),
``{"fault": "fail_event_registration", "gpu": 0, "attempts": 1}`` (the GPU's event registration
is lost and fails that many more times: its Xid and ECC events are lost meanwhile),
``{"fault": "fail_apply", "count": 1}``,
``{"fault": "run_process", "gpu": 0, "start": 4, "memory_mib": 1024}`` (``start``: the MIG
instance's first memory slice, or ``null`` for the whole GPU),
``{"fault": "kill_process", "pid": 10001}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from hostagent.gpu.simulated import SimulatedBackend

logger = logging.getLogger(__name__)


class FaultError(ValueError):
    """A fault command that cannot be applied."""


def apply_fault(backend: SimulatedBackend, command: dict[str, Any]) -> dict[str, Any]:
    """Apply one fault command; returns what happened (e.g. the PID of a started process)."""
    kind = command.get("fault")
    gpus = backend.list_gpus()
    index = int(command.get("gpu", 0))
    if not 0 <= index < len(gpus):
        raise FaultError(f"no GPU {index}")
    uuid = gpus[index].uuid
    if kind == "xid":
        backend.inject_xid(uuid, int(command["xid"]), command.get("gpu_instance_id"))
    elif kind == "ecc":
        backend.inject_ecc(
            uuid,
            uncorrected=int(command.get("uncorrected", 0)),
            corrected=int(command.get("corrected", 0)),
        )
    elif kind == "lose_gpu":
        backend.lose_gpu(uuid)
    elif kind == "restore_gpu":
        backend.restore_gpu(uuid)
    elif kind == "crash_mps":
        backend.crash_mps(uuid)
    elif kind == "reset_gpu":
        backend.reset_gpu(uuid, force=True)
    elif kind == "fail_event_registration":
        backend.fail_event_registration(uuid, int(command.get("attempts", 1)))
    elif kind == "slow_apply":
        backend.slow_apply(float(command["seconds"]))
    elif kind == "fail_apply":
        backend.fail_apply(int(command.get("count", 1)))
    elif kind == "run_process":
        return {"pid": _run_process(backend, uuid, command)}
    elif kind == "kill_process":
        backend.kill_process(int(command["pid"]))
    else:
        raise FaultError(f"unknown fault {kind!r}")
    return {}


def _run_process(backend: SimulatedBackend, uuid: str, command: dict[str, Any]) -> int:
    start = command.get("start")
    instance_id = None
    if start is not None:
        found = [i for i in backend.mig_instances(uuid) if i.start == int(start)]
        if not found:
            raise FaultError(f"no MIG instance at slice {start}")
        instance_id = found[0].gpu_instance_id
    return backend.run_process(
        uuid, int(command.get("memory_mib", 1024)), gpu_instance_id=instance_id
    )


async def watch_faults(
    backend: SimulatedBackend, directory: Path, stop: asyncio.Event, period_s: float = 0.2
) -> None:
    """Apply the commands dropped in ``directory`` until ``stop`` is set.

    The outcome of ``name.json`` is written to ``name.done`` (or ``name.error``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    while not stop.is_set():
        for path in sorted(directory.glob("*.json")):
            try:
                result = apply_fault(backend, json.loads(path.read_text(encoding="utf-8")))
                path.with_suffix(".done").write_text(json.dumps(result), encoding="utf-8")
            except (FaultError, ValueError, KeyError, LookupError) as exc:
                logger.warning("fault %s failed: %s", path.name, exc)
                path.with_suffix(".error").write_text(str(exc), encoding="utf-8")
            path.unlink(missing_ok=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=period_s)
