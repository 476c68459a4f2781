"""Fleet state for a live load test: hosts with per-host tokens, a viewer with a session and an
API token.

Runs inside the stack's database: ``python -m fleet.bench.seed setup N GPUS PRODUCT OUT.json``
(a fresh process with the stack's environment) or in-process with ``--url``. Its functions
import Django and the apps inside themselves: the module is imported (``python -m``) before
Django is set up for the stack's database.
"""

from __future__ import annotations

import json
import sys
import uuid as uuidlib
from pathlib import Path
from typing import Any

BENCH_USER = "bench-viewer"


def gpu_uuid(run: str, host: int, index: int) -> str:
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'fleet-bench/{run}/{host}/{index}')}"


def setup(
    *,
    hosts: int,
    gpus_per_host: int,
    product_key: str,
    run: str,
    enrolled: bool = True,
    api_token: bool = False,
) -> dict[str, Any]:
    """``hosts`` new hosts named ``bench-<run>-<i>`` with host tokens and GPU specs; a viewer
    user, a session key for the browser clients and (``api_token``) an API token for scripted
    ones. ``enrolled``: the hosts' GPUs are already
    known (adopted as the agents' first hello would), so the agents' hellos are reconnects."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from fleet.agents.discovery import gpus_adopt
    from fleet.agents.enrollment import host_issue_token
    from fleet.core.roles import Role
    from fleet.core.services import api_token_create, user_create
    from fleet.inventory.services import host_create
    from fleet.inventory.simulation import simulated_spec
    from fleet.mig import product_by_key

    product = product_by_key(product_key)
    if product is None:
        raise SystemExit(f"unknown product {product_key!r}")
    out = []
    for i in range(hosts):
        host, _ = host_create(name=f"bench-{run}-{i:05d}")
        token = host_issue_token(host)
        specs = [simulated_spec(product, uuid=gpu_uuid(run, i, g)) for g in range(gpus_per_host)]
        if enrolled:  # the GPUs are known, as in a fleet whose servers restart
            gpus_adopt(host=host, gpus=_discovered(specs))
        out.append({"host_id": host.pk, "token": token, "gpus": specs})
    user = user_create(username=BENCH_USER, password=None, role=Role.VIEWER)
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "fleet.core.sso.local.LocalBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    result = {"hosts": out, "session_key": session.session_key}
    if api_token:
        result["api_token"] = api_token_create(user=user, name="bench")[1]
    return result


def place_replicas(run: str, replicas: int) -> None:
    """``replicas`` whole-GPU replicas placed by the engine on the hosts that are up: a fleet
    with work on it, which a server restart must not move."""
    from fleet.allocations.autoplace import deployment_create_placed
    from fleet.allocations.services import DeploymentRequest

    deployment_create_placed(
        name=f"bench-{run}",
        request=DeploymentRequest(kind="gpu", gpu_count=1),
        replicas=replicas,
    )


def placements(database_url: str) -> dict[int, tuple[int | None, int | None, str]]:
    """``{allocation id: (gpu id, partition id, state)}`` of every allocation, read straight from
    the stack's database (the bench process has no Django set up for it)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, gpu_id, partition_id, state FROM allocations_allocation"
        ).fetchall()
    return {int(r[0]): (r[1], r[2], str(r[3])) for r in rows}


def _discovered(specs: list[Any]) -> list[Any]:
    """What an agent on these simulated GPUs reports in its hello."""
    from hostagent.collector import Collector
    from hostagent.gpu.simulated import SimulatedBackend

    backend = SimulatedBackend(specs, seed=0)
    backend.init()
    return list(Collector(backend, hostname="seed", mps=None).hello(0)["gpus"])


def gpu_map(host_ids: list[int]) -> dict[str, list[int]]:
    """``{str(host id): [gpu ids]}`` of the GPUs the agents have reported so far."""
    from fleet.inventory.models import Gpu

    found: dict[str, list[int]] = {str(h): [] for h in host_ids}
    for gpu_id, host_id in Gpu.objects.filter(host_id__in=host_ids).values_list("pk", "host_id"):
        found[str(host_id)].append(gpu_id)
    return found


def cleanup(run: str) -> int:
    """Delete the hosts (and their GPUs, cascading) a run created (``--url`` mode)."""
    from fleet.inventory.models import Host

    deleted, _ = Host.objects.filter(name__startswith=f"bench-{run}-").delete()
    return deleted


def main(argv: list[str]) -> int:
    import django

    django.setup()
    command = argv[0]
    if command == "setup":
        hosts, gpus, product, run, out = argv[1:6]
        result = setup(
            hosts=int(hosts),
            gpus_per_host=int(gpus),
            product_key=product,
            run=run,
            enrolled="--new" not in argv[6:],
            api_token="--api-token" in argv[6:],
        )
        Path(out).write_text(json.dumps(result), encoding="utf-8")
    elif command == "place":
        place_replicas(argv[1], int(argv[2]))
    elif command == "gpus":
        source, out = argv[1:3]
        host_ids = json.loads(Path(source).read_text(encoding="utf-8"))
        Path(out).write_text(json.dumps(gpu_map(host_ids)), encoding="utf-8")
    else:
        raise SystemExit(f"unknown command {command!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
