"""An agent restart loses nothing the GPU keeps: a real ``fleet-agent`` process on a simulated
H100 cut into two MIG instances is SIGKILLed and started again without ``--allow-mutation``
(so it cannot re-create anything); its reports show the same instances, with the same MIG
device UUIDs, and the GPU is still what Fleet wants it to be."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.stack import Stack, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TWO_3G = {
    "mode": "mig",
    "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
}


def mig_devices(stack: Stack, gpu_id: int) -> list[tuple[int, int, str]]:
    observed = stack.get(f"/api/v1/gpus/{gpu_id}/").get("observed") or {}
    instances: list[dict[str, Any]] = observed.get("mig_instances") or []
    return sorted((i["profile_id"], i["start"], str(i.get("uuid"))) for i in instances)


def test_a_restarted_agent_reports_the_mig_layout_its_gpu_kept(stack: Stack):
    agent = stack.add_agent("kept-1", ["h100-sxm5-80gb"])
    (gpu,) = stack.gpus(agent)
    status, op = stack.request("PUT", f"/api/v1/gpus/{gpu['id']}/layout", TWO_3G)
    assert status == 202, op
    assert stack.wait_operation(op["id"])["status"] == "succeeded"
    wait_until(lambda: stack.converged(gpu["id"]), 20, what="the MIG layout")
    before = mig_devices(stack, gpu["id"])
    assert len(before) == 2 and all(uuid.startswith("MIG-") for _, _, uuid in before), before

    agent.kill()
    restarted = time.time()
    agent.start(allow_mutation=False)

    def reported_since() -> bool:
        seen = stack.get(f"/api/v1/hosts/{agent.host_id}/").get("last_seen_at")
        return bool(seen) and datetime.fromisoformat(seen).timestamp() > restarted + 1.5

    wait_until(reported_since, 30, what="the restarted agent's reports")
    assert mig_devices(stack, gpu["id"]) == before
    assert stack.converged(gpu["id"])
