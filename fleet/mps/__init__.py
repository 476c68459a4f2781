"""Pure MPS rules: client requests, device capacity, operator policy and daemon settings.

Stdlib only: importing this package never boots Django.
"""

from __future__ import annotations

from fleet.mps.daemon import client_environment, daemon_commands
from fleet.mps.rules import check_fit, free_memory_mib, max_clients
from fleet.mps.values import (
    MAX_CLIENTS_PER_GPU,
    MAX_COMPUTE_PERCENT,
    MpsDevice,
    MpsPolicy,
    MpsRequest,
    validate_policy,
    validate_request,
)

__all__ = [
    "MAX_CLIENTS_PER_GPU",
    "MAX_COMPUTE_PERCENT",
    "MpsDevice",
    "MpsPolicy",
    "MpsRequest",
    "check_fit",
    "client_environment",
    "daemon_commands",
    "free_memory_mib",
    "max_clients",
    "validate_policy",
    "validate_request",
]
