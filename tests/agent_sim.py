"""An in-process simulated agent for tests: the real hostagent backend, collector and reconcile
code, driven by hand instead of by its network loop."""

from __future__ import annotations

from pathlib import Path

from fleet.inventory.simulation import simulated_spec
from fleet.mig import product_by_key
from hostagent import protocol
from hostagent.collector import Collector
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from hostagent.reconcile import apply_desired_state


class SimAgent:
    def __init__(
        self,
        product_keys: list[str],
        *,
        seed: int = 0,
        tmp: Path = Path("/tmp/fleet-test-mps"),
        allow_mutation: bool = True,
    ):
        specs = [simulated_spec(product_by_key(k)) for k in product_keys]  # type: ignore[arg-type]
        self.backend = SimulatedBackend(specs, seed=seed)
        self.backend.init()
        self.mps = MpsManager(self.backend.mps_control, tmp / str(seed))
        self.collector = Collector(
            self.backend, hostname=f"sim-{seed}", mps=self.mps, allow_mutation=allow_mutation
        )
        self.allow_mutation = allow_mutation
        self.applied = 0

    def hello(self) -> protocol.Hello:
        return self.collector.hello(self.applied)

    def telemetry(self) -> protocol.Telemetry:
        return self.collector.telemetry()

    def apply(self, desired: protocol.DesiredState) -> protocol.Ack:
        items = apply_desired_state(self.backend, desired, self.allow_mutation, self.mps)
        if self.allow_mutation:
            self.applied = desired["generation"]
        return {
            "type": "ack",
            "generation": desired["generation"],
            "status": protocol.ack_status(items),
            "items": items,
            "observed": self.collector.gpu_infos(),
        }
