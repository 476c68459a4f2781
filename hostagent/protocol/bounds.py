"""Bounds of the agent protocol: what a real host can send, with room to spare. Anything
beyond is refused by :mod:`hostagent.protocol.codec`."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

# --------------------------------------------------------------------------------------------
# Bounds: what a real host can send, with room to spare. Anything beyond is refused.
# --------------------------------------------------------------------------------------------

MAX_TEXT = 256
"""Characters of any string (names, versions, messages, details, paths)."""
MAX_UUID = 96
"""Characters of a GPU or MIG device UUID (``GPU-`` + 36 today)."""
MAX_GPUS_HARD = 1024
"""GPUs in one message, whatever the server allows (it allows fewer: 64 by default)."""
MAX_GPUS_PER_HOST = 64
"""The default cap a server applies to one host's GPUs (``FLEET_AGENT_MAX_GPUS``)."""
MAX_MIG_INSTANCES = 7
"""MIG instances per GPU (A100/H100/H200/B200: 7; A30, RTX PRO 6000: 4)."""
MAX_PROFILES = 32
"""GPU-instance profiles per GPU (the 12-slice RTX PRO 6000 has 11)."""
MAX_PLACEMENTS_PER_PROFILE = 8
"""Placements per profile (a 1-slice profile on an 8-slice GPU has 7)."""
MAX_MEMORY_SLICES = 16
"""Memory slices of a MIG placement grid (8, 4 or 12 today)."""
MAX_PROCESSES = 256
"""Compute processes per GPU in one sample (and PIDs per item result)."""
MAX_ITEMS = 4096
"""Item results in one ack, allocations of one desired GPU."""
MAX_GENERATION = 2**63 - 1

Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Uuid = Annotated[str, Meta(min_length=1, max_length=MAX_UUID)]
UuidOrEmpty = Annotated[str, Meta(max_length=MAX_UUID)]
U32 = Annotated[int, Meta(ge=0, le=2**32 - 1)]
Counter = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Generation = Annotated[int, Meta(ge=0, le=MAX_GENERATION)]
GpuIndex = Annotated[int, Meta(ge=0, le=MAX_GPUS_HARD - 1)]
InstanceId = Annotated[int, Meta(ge=0, le=0xFFFF)]
ProfileId = Annotated[int, Meta(ge=0, le=255)]
ProfileKey = Annotated[str, Meta(pattern=r"^[0-9]{1,3}$")]
SliceIndex = Annotated[int, Meta(ge=0, le=MAX_MEMORY_SLICES - 1)]
SliceSize = Annotated[int, Meta(ge=1, le=MAX_MEMORY_SLICES)]
SliceCount = Annotated[int, Meta(ge=0, le=MAX_MEMORY_SLICES)]
InstanceCount = Annotated[int, Meta(ge=0, le=MAX_MIG_INSTANCES)]
PlacementPair = Annotated[list[SliceIndex], Meta(min_length=2, max_length=2)]
"""``[start, size]``; both are checked against the grid by :func:`check_message`."""
MiB = Annotated[int, Meta(ge=0, le=2**32)]
Percent = Annotated[int, Meta(ge=0, le=100)]
Utilization = Annotated[float, Meta(ge=0.0, le=100.0)]
Celsius = Annotated[int, Meta(ge=-50, le=150)]
Milliwatts = Annotated[int, Meta(ge=0, le=10**7)]
Timestamp = Annotated[float, Meta(ge=0.0, le=1e11)]
"""Unix seconds; the server also refuses a ``ts`` more than a day from its own clock."""


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis), so a message stays valid."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
