"""The simulator with the failures and the slowness of a real driver (review D1, D11, D17).

``fail(call, *errors)`` makes the next calls of ``call`` raise ``errors``, one per call;
``slow_create_s`` makes each GPU-instance creation take that long (outside the simulator's lock,
as a real NVML call holds no lock of ours). ``log`` records calls in order, across threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from hostagent.gpu.backend import GpuDevice, GpuEvent, GpuSample, MigInstance
from hostagent.gpu.simulated import SimulatedBackend


class Nvml999(Exception):
    """What an unknown NVML error looks like to code that expects only BackendError."""


class FaultyBackend(SimulatedBackend):
    def __init__(self, specs: list[Any], seed: int = 0, **kwargs: Any) -> None:
        super().__init__(specs, seed, **kwargs)
        self.failures: dict[str, list[BaseException]] = {}
        self.slow_create_s = 0.0
        self.log: list[str] = []
        self._log_lock = threading.Lock()

    def fail(self, call: str, *errors: BaseException) -> None:
        self.failures.setdefault(call, []).extend(errors)

    def count(self, call: str) -> int:
        return self.log.count(call)

    def _call(self, call: str) -> None:
        with self._log_lock:
            self.log.append(call)
            queue = self.failures.get(call)
            error = queue.pop(0) if queue else None
        if error is not None:
            raise error

    def init(self) -> None:
        self._call("init")
        super().init()

    def shutdown(self) -> None:
        self._call("shutdown")
        super().shutdown()

    def driver_version(self) -> str | None:
        self._call("driver_version")
        return super().driver_version()

    def list_gpus(self) -> list[GpuDevice]:
        self._call("list_gpus")
        return super().list_gpus()

    def sample(self, gpu: str) -> GpuSample:
        self._call("sample")
        return super().sample(gpu)

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        self._call("wait_events")
        return super().wait_events(timeout_ms)

    def set_mig_mode(self, gpu: str, enabled: bool) -> Any:
        self._call("set_mig_mode")
        return super().set_mig_mode(gpu, enabled)

    def create_gpu_instance(self, gpu: str, profile_id: int, start: int) -> MigInstance:
        self._call("create_gpu_instance")
        time.sleep(self.slow_create_s)
        created = super().create_gpu_instance(gpu, profile_id, start)
        self._call("create_gpu_instance done")
        return created
