"""MPS capacity rules: client requests, device capacity, operator policy, daemon settings.

Requests follow the AWS ECS ``nvidiaMps`` sharing strategy: a client declares the device memory it
reserves (``memory_mib``, required, at least 1) and optionally a compute limit
(``max_compute_percent``, 1..100; ``None`` means 100). The compute percentage is "a limit, not a
reservation", so only memory and the client count are capacity. Capacity is counted from
reservations, never from measured use.

One MPS control daemon (``nvidia-cuda-mps-control -d``) serves one device: a whole GPU, or one MIG
instance running its own daemon with its own ``CUDA_MPS_PIPE_DIRECTORY``. An :class:`MpsDevice` is
the capacity of one such daemon.

Stdlib only: importing this module never boots Django.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.domain import Violation
from fleet.mps.values import (
    EXCEEDS_POLICY_LIMIT,
    MAX_COMPUTE_PERCENT,
    MEMORY_EXCEEDS_DEVICE,
    MEMORY_OVERCOMMIT,
    TOO_MANY_CLIENTS,
    MpsDevice,
    MpsPolicy,
    MpsRequest,
    validate_request,
)


def free_memory_mib(device: MpsDevice, existing: Sequence[MpsRequest]) -> int:
    """Device memory not yet reserved by the daemon's clients.

    Args:
        device: the capacity of the daemon's device.
        existing: the clients already placed there.

    Returns:
        ``device.memory_mib`` minus the reservations, never below 0 (a device that shrank under
        its clients has nothing free, not a debt).
    """
    return max(0, device.memory_mib - _reserved_mib(existing))


def max_clients(device: MpsDevice, policy: MpsPolicy | None = None) -> int:
    """The number of clients the device accepts under a policy.

    Args:
        device: the capacity of the daemon's device.
        policy: the operator's policy, if any.

    Returns:
        The device's limit, lowered to the policy's ``max_clients`` when that is set.
    """
    if policy is None or policy.max_clients is None:
        return device.max_clients
    return min(device.max_clients, policy.max_clients)


def check_fit(
    device: MpsDevice,
    existing: Sequence[MpsRequest],
    request: MpsRequest,
    policy: MpsPolicy | None = None,
) -> tuple[Violation, ...]:
    """Check whether one more client fits on a daemon's device.

    The ``existing`` clients are taken as placed (not re-validated); their order does not matter.
    The policy itself is checked by :func:`validate_policy`, not here.

    Args:
        device: the capacity of the daemon's device.
        existing: the clients already placed there.
        request: the client to add.
        policy: the operator's policy for the daemon, if any.

    Returns:
        Every violation, empty when the client fits: :func:`validate_request`'s;
        ``mps.memory_exceeds_device`` (the request alone is larger than the device; then
        ``mps.memory_overcommit`` is not repeated); ``mps.memory_overcommit`` (the reservations
        would sum past the device's memory; details ``free_mib`` and ``requested_mib``);
        ``mps.too_many_clients`` (the MPS client limit, or the policy's cap, is reached);
        ``mps.exceeds_policy_limit`` (the request is above the daemon's
        ``set_default_device_pinned_mem_limit`` or ``set_default_active_thread_percentage``,
        which a client's ``CUDA_MPS_*`` variables can only lower, never raise).
    """
    violations = list(validate_request(request))
    if request.memory_mib >= 1:
        violations.extend(_memory_violations(device, existing, request))
    violations.extend(_client_count_violations(device, existing, policy))
    if policy is not None:
        violations.extend(_policy_limit_violations(policy, request))
    return tuple(violations)


def _reserved_mib(existing: Sequence[MpsRequest]) -> int:
    return sum(client.memory_mib for client in existing)


def _memory_violations(
    device: MpsDevice, existing: Sequence[MpsRequest], request: MpsRequest
) -> tuple[Violation, ...]:
    if request.memory_mib > device.memory_mib:
        return (
            Violation(
                MEMORY_EXCEEDS_DEVICE,
                f"The request of {request.memory_mib} MiB is larger than the device's "
                f"{device.memory_mib} MiB.",
                {"requested_mib": request.memory_mib, "device_memory_mib": device.memory_mib},
            ),
        )
    if _reserved_mib(existing) + request.memory_mib > device.memory_mib:
        free = free_memory_mib(device, existing)
        return (
            Violation(
                MEMORY_OVERCOMMIT,
                f"The request of {request.memory_mib} MiB does not fit in the {free} MiB "
                "not yet reserved on the device.",
                {"free_mib": free, "requested_mib": request.memory_mib},
            ),
        )
    return ()


def _client_count_violations(
    device: MpsDevice, existing: Sequence[MpsRequest], policy: MpsPolicy | None
) -> tuple[Violation, ...]:
    limit = max_clients(device, policy)
    if len(existing) < limit:
        return ()
    return (
        Violation(
            TOO_MANY_CLIENTS,
            f"The device already has {len(existing)} MPS clients; it accepts {limit}.",
            {"clients": len(existing), "max_clients": limit},
        ),
    )


def _policy_limit_violations(policy: MpsPolicy, request: MpsRequest) -> tuple[Violation, ...]:
    violations: list[Violation] = []
    limit = policy.default_pinned_mem_limit_mib
    if limit is not None and request.memory_mib > limit:
        violations.append(
            Violation(
                EXCEEDS_POLICY_LIMIT,
                f"The request of {request.memory_mib} MiB is above the daemon's per-client "
                f"limit of {limit} MiB.",
                {"resource": "memory_mib", "requested": request.memory_mib, "limit": limit},
            )
        )
    percent = request.max_compute_percent
    default = policy.default_active_thread_percentage
    # An out-of-range percentage is already mps.compute_percent_out_of_range.
    if percent is not None and default < percent <= MAX_COMPUTE_PERCENT:
        violations.append(
            Violation(
                EXCEEDS_POLICY_LIMIT,
                f"The compute limit of {percent}% is above the daemon's default of {default}%.",
                {"resource": "compute_percent", "requested": percent, "limit": default},
            )
        )
    return tuple(violations)
