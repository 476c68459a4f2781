"""An agent's workload side on a simulated GPU: the backend, the MPS manager, a real runtime,
the supervisor and the apply, wired as the daemon wires them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from hostagent.protocol import DesiredAllocation, DesiredState, ItemResult, Workload
from hostagent.reconcile import ResetLedger, apply_desired_state
from hostagent.runtime import Runtime, Supervisor, Timing, WorkloadSync
from tests.hostagent import specs

FAST = Timing.scaled(0.01, poll_s=0.05)


@dataclass
class Host:
    sim: SimulatedBackend
    mps: MpsManager
    supervisor: Supervisor
    sync: WorkloadSync

    @property
    def gpu(self) -> str:
        return self.sim.list_gpus()[0].uuid

    def apply(self, desired: DesiredState) -> list[ItemResult]:
        return apply_desired_state(
            self.sim, desired, True, self.mps, resets=ResetLedger(), workloads=self.sync
        )

    def mig_uuid(self, profile_id: int, start: int) -> str:
        [instance] = [
            i
            for i in self.sim.mig_instances(self.gpu)
            if (i.profile_id, i.start) == (profile_id, start)
        ]
        assert instance.uuid is not None
        return instance.uuid

    def state(self, allocation_id: int) -> str | None:
        return self.supervisor.states().get(allocation_id)

    def status(self, allocation_id: int):
        report = self.supervisor.take_report(full=True)
        return next(w for w in report["workloads"] if w["allocation_id"] == allocation_id)


def make_host(tmp_path: Path, runtimes: dict[str, Runtime], agent_runtime="docker", timing=FAST):
    sim = SimulatedBackend([specs.a30()], seed=7)
    sim.init()
    mps = MpsManager(sim.mps_control, tmp_path / "mps")
    supervisor = Supervisor(
        runtimes, agent_runtime=agent_runtime, state_dir=tmp_path / "workloads", timing=timing
    )
    supervisor.start()
    return Host(sim, mps, supervisor, WorkloadSync(supervisor, sim, gpu_request=False))


def allocation(
    allocation_id: int, workload: Workload, partition_key: str | None = "p0", **extra
) -> DesiredAllocation:
    alloc: DesiredAllocation = {
        "key": f"alloc-{allocation_id}",
        "gpu_uuid": "",
        "partition_key": partition_key,
        "memory_mib": None,
        "max_compute_percent": None,
        "allocation_id": allocation_id,
        "deployment": "qwen-7b",
        "replica": allocation_id % 10,
        "workload": workload,
    }
    alloc.update(extra)  # type: ignore[typeddict-item]
    return alloc


def desired(
    gpu: str,
    generation: int,
    allocations=(),
    instances=((5, 0),),
    *,
    mig: bool = True,
    mps: bool = False,
) -> DesiredState:
    allocs = [dict(a, gpu_uuid=gpu) for a in allocations]
    return {
        "type": "desired_state",
        "generation": generation,
        "gpus": {
            gpu: {
                "mode": "mig" if mig else ("mps" if mps else "dedicated"),
                "mig_enabled": mig,
                "instances": [
                    {"key": f"p{i}", "profile_id": p, "start": s}
                    for i, (p, s) in enumerate(instances)
                ],
                "mps": {
                    "enabled": mps,
                    "per_instance": False,
                    "default_active_thread_percentage": None,
                    "default_pinned_mem_limit_mib": None,
                },
                "allocations": allocs,  # type: ignore[typeddict-item]
            }
        },
    }
