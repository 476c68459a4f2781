"""MPS values: client requests, device capacity, operator policy, and their own validation.

Stdlib only: importing this module never boots Django.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.domain import Violation

# Client CUDA contexts per device on Volta and later, as the MIG user guide quotes it ("the maximum
# number of clients (48) is lowered proportionally to the Compute Instance size"). Secondary notes
# quote the CUDA 13.1+ MPS doc as raising this to 60; that number is not verified in a primary
# source, so we keep the conservative 48 until it is.
MAX_CLIENTS_PER_GPU: int = 48

MAX_COMPUTE_PERCENT: int = 100
"""The full device; also the meaning of ``max_compute_percent=None`` and the daemon's default."""

MEMORY_INVALID = "mps.memory_invalid"
COMPUTE_PERCENT_OUT_OF_RANGE = "mps.compute_percent_out_of_range"
MEMORY_EXCEEDS_DEVICE = "mps.memory_exceeds_device"
MEMORY_OVERCOMMIT = "mps.memory_overcommit"
TOO_MANY_CLIENTS = "mps.too_many_clients"
EXCEEDS_POLICY_LIMIT = "mps.exceeds_policy_limit"
POLICY_THREAD_PERCENTAGE_OUT_OF_RANGE = "mps.policy_thread_percentage_out_of_range"
POLICY_MEMORY_LIMIT_INVALID = "mps.policy_memory_limit_invalid"
POLICY_MEMORY_LIMIT_EXCEEDS_DEVICE = "mps.policy_memory_limit_exceeds_device"
POLICY_MAX_CLIENTS_OUT_OF_RANGE = "mps.policy_max_clients_out_of_range"


@dataclass(frozen=True)
class MpsRequest:
    """What one MPS client asks for (ECS ``sharingStrategy.nvidiaMps``).

    Attributes:
        memory_mib: device memory reserved for the client, in MiB; becomes
            ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. Required, at least 1.
        max_compute_percent: upper bound on the client's share of SMs, 1..100; becomes
            ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. ``None`` means 100 (no further limit).
    """

    memory_mib: int
    max_compute_percent: int | None = None

    @property
    def effective_compute_percent(self) -> int:
        """The compute limit the client runs under: ``max_compute_percent``, or 100 when unset."""
        if self.max_compute_percent is None:
            return MAX_COMPUTE_PERCENT
        return self.max_compute_percent


@dataclass(frozen=True)
class MpsDevice:
    """The capacity of the device one MPS control daemon serves.

    Attributes:
        memory_mib: device memory the daemon's clients share, in MiB (for a MIG instance, the GPU
            instance's memory, which its compute instances share).
        max_clients: client CUDA contexts the MPS server accepts on this device.

    Raises:
        ValueError: when ``memory_mib`` or ``max_clients`` is below 1.
    """

    memory_mib: int
    max_clients: int

    def __post_init__(self) -> None:
        if self.memory_mib < 1:
            raise ValueError(f"MPS device memory must be at least 1 MiB, got {self.memory_mib}")
        if self.max_clients < 1:
            raise ValueError(f"MPS device must accept at least 1 client, got {self.max_clients}")

    @classmethod
    def whole_gpu(cls, memory_mib: int) -> MpsDevice:
        """A whole GPU with its own daemon, accepting :data:`MAX_CLIENTS_PER_GPU` clients.

        Args:
            memory_mib: the GPU's total memory (``nvmlDeviceGetMemoryInfo().total``), in MiB.

        Returns:
            The device capacity.
        """
        return cls(memory_mib=memory_mib, max_clients=MAX_CLIENTS_PER_GPU)

    @classmethod
    def mig_instance(
        cls, memory_mib: int, compute_slices: int, gpu_compute_slices: int
    ) -> MpsDevice:
        """A MIG instance running its own daemon (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``).

        The MIG user guide: "the maximum number of clients (48) is lowered proportionally to the
        Compute Instance size" without saying how it rounds. We round down, so Fleet never promises
        a client slot the driver might refuse, and keep at least 1: ``floor(48 * compute_slices /
        gpu_compute_slices)``. A 3g instance of a 7-slice GPU gets 20 clients, a 1g gets 6; on the
        4-slice A30 a 1g gets 12.

        Args:
            memory_mib: the instance's memory, in MiB.
            compute_slices: the compute instance's SM slices (the ``3`` of ``3g.40gb``).
            gpu_compute_slices: the GPU's SM slices in MIG mode (7 on A100/H100/H200/B200, 4 on
                A30).

        Returns:
            The device capacity.

        Raises:
            ValueError: when ``gpu_compute_slices`` is below 1 or ``compute_slices`` is outside
                ``1..gpu_compute_slices``.
        """
        if gpu_compute_slices < 1:
            raise ValueError(f"a GPU has at least 1 compute slice, got {gpu_compute_slices}")
        if not 1 <= compute_slices <= gpu_compute_slices:
            raise ValueError(
                f"compute slices must be in 1..{gpu_compute_slices}, got {compute_slices}"
            )
        max_clients = max(1, MAX_CLIENTS_PER_GPU * compute_slices // gpu_compute_slices)
        return cls(memory_mib=memory_mib, max_clients=max_clients)


@dataclass(frozen=True)
class MpsPolicy:
    """An operator's settings for one device's daemon (``PUT /gpus/{id}/layout`` with mode mps).

    Attributes:
        default_active_thread_percentage: the daemon's default compute limit, 1..100
            (``set_default_active_thread_percentage``; the driver's default is 100).
        default_pinned_mem_limit_mib: the daemon's default per-client memory limit, in MiB
            (``set_default_device_pinned_mem_limit``); ``None`` means no limit, the driver's
            default.
        max_clients: the operator's cap on clients, at most the device's own limit; ``None`` means
            the device's limit. MPS has no control command for this, Fleet enforces it.
    """

    default_active_thread_percentage: int = MAX_COMPUTE_PERCENT
    default_pinned_mem_limit_mib: int | None = None
    max_clients: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        """The one JSON form of a policy (the layout API's ``mps`` object)."""
        return {
            "default_active_thread_percentage": self.default_active_thread_percentage,
            "default_pinned_mem_limit_mib": self.default_pinned_mem_limit_mib,
            "max_clients": self.max_clients,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> MpsPolicy:
        """The policy a JSON form describes; absent keys take the driver's defaults (100 %, no
        memory limit, the device's client limit) and unknown keys are ignored."""
        return cls(
            default_active_thread_percentage=raw.get(
                "default_active_thread_percentage", MAX_COMPUTE_PERCENT
            ),
            default_pinned_mem_limit_mib=raw.get("default_pinned_mem_limit_mib"),
            max_clients=raw.get("max_clients"),
        )


def validate_request(request: MpsRequest) -> tuple[Violation, ...]:
    """Check a client request on its own, before any device is considered.

    Args:
        request: the client's request.

    Returns:
        Every violation: ``mps.memory_invalid`` (``memory_mib`` below 1, which
        ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` cannot express) and
        ``mps.compute_percent_out_of_range`` (``max_compute_percent`` outside 1..100, the range of
        ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). Empty when the request is valid.
    """
    violations: list[Violation] = []
    if request.memory_mib < 1:
        violations.append(
            Violation(
                MEMORY_INVALID,
                f"An MPS client must reserve at least 1 MiB, got {request.memory_mib}.",
                {"memory_mib": request.memory_mib},
            )
        )
    percent = request.max_compute_percent
    if percent is not None and not 1 <= percent <= MAX_COMPUTE_PERCENT:
        violations.append(
            Violation(
                COMPUTE_PERCENT_OUT_OF_RANGE,
                f"max_compute_percent must be between 1 and 100, got {percent}.",
                {"max_compute_percent": percent},
            )
        )
    return tuple(violations)


def validate_policy(device: MpsDevice, policy: MpsPolicy) -> tuple[Violation, ...]:
    """Check an operator's daemon policy against the device it applies to.

    Args:
        device: the capacity of the daemon's device.
        policy: the operator's policy.

    Returns:
        Every violation: ``mps.policy_thread_percentage_out_of_range`` (not 1..100, the range of
        ``set_default_active_thread_percentage``), ``mps.policy_memory_limit_invalid`` (below
        1 MiB), ``mps.policy_memory_limit_exceeds_device`` (more than the device's memory, which
        ``set_default_device_pinned_mem_limit`` would make meaningless) and
        ``mps.policy_max_clients_out_of_range`` (below 1 or above the device's limit).
    """
    violations: list[Violation] = []
    percent = policy.default_active_thread_percentage
    if not 1 <= percent <= MAX_COMPUTE_PERCENT:
        violations.append(
            Violation(
                POLICY_THREAD_PERCENTAGE_OUT_OF_RANGE,
                f"The default active thread percentage must be between 1 and 100, got {percent}.",
                {"default_active_thread_percentage": percent},
            )
        )
    limit = policy.default_pinned_mem_limit_mib
    if limit is not None and limit < 1:
        violations.append(
            Violation(
                POLICY_MEMORY_LIMIT_INVALID,
                f"The default pinned memory limit must be at least 1 MiB, got {limit}.",
                {"default_pinned_mem_limit_mib": limit},
            )
        )
    elif limit is not None and limit > device.memory_mib:
        violations.append(
            Violation(
                POLICY_MEMORY_LIMIT_EXCEEDS_DEVICE,
                f"The default pinned memory limit of {limit} MiB exceeds the device's "
                f"{device.memory_mib} MiB.",
                {"default_pinned_mem_limit_mib": limit, "device_memory_mib": device.memory_mib},
            )
        )
    cap = policy.max_clients
    if cap is not None and not 1 <= cap <= device.max_clients:
        violations.append(
            Violation(
                POLICY_MAX_CLIENTS_OUT_OF_RANGE,
                f"The client cap must be between 1 and the device's {device.max_clients}, "
                f"got {cap}.",
                {"max_clients": cap, "device_max_clients": device.max_clients},
            )
        )
    return tuple(violations)
