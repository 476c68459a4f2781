"""MIG discovery over NVML: profiles, placements, GPU and compute instances.

Every lookup is per profile, so one profile NVML will not describe (NO_PERMISSION as non-root,
NOT_SUPPORTED) is skipped instead of blanking the GPU (review D13). Nothing empty or partial is
cached, and the cache is keyed on the MIG mode: R535-era drivers answer NOT_SUPPORTED for every
profile while MIG is off (nvml.h L12855; mig-parted discovery.go), and the profiles appear once
it is on (review D2). Drivers before R510 have no V-variant profile-info symbols; the version-1
structs are used then (review D14).
"""

from __future__ import annotations

import ctypes
import logging
import math
from dataclasses import dataclass
from typing import Any

from hostagent.gpu.backend import GpuLost, ProfilePlacements, normalize_profile_name
from hostagent.gpu.nvml_lib import (
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NO_SUCH_PROFILE,
    NOT_FOUND,
    UNAVAILABLE,
    Answer,
    Nvml,
)

logger = logging.getLogger(__name__)

MAX_PLACEMENTS = 32
# mig-parted hard-codes A30 profiles because "GetGpuInstanceProfileInfo returns incorrect
# InstanceCount values" (discovery.go): size the GI array generously (review §3.2).
MIN_INSTANCE_ARRAY = 8
# The media kind a GPU-instance profile constant stands for (nvml.h, facts §1.1): what the
# version-1 struct, which has no name, still tells about "+me" and friends.
_MEDIA_SUFFIX = {
    0x7: "+me",
    0x8: "+me",
    0xA: "+gfx",
    0xB: "+gfx",
    0xC: "+gfx",
    0x11: "+gfx",
    0xD: "-me",
    0xE: "-me",
    0xF: "+me.all",
    0x10: "+me.all",
}


@dataclass(frozen=True)
class GiProfileInfo:
    """``nvmlGpuInstanceProfileInfo_v2_t`` (or v1) for the constant that answered."""

    constant: int
    id: int
    raw_name: str
    name: str
    slices: int
    instance_count: int
    multiprocessor_count: int
    memory_mib: int


@dataclass(frozen=True)
class CiProfileInfo:
    """``nvmlComputeInstanceProfileInfo_v2_t`` (or v1) for the constant that answered."""

    constant: int
    id: int
    name: str
    slices: int
    instance_count: int
    multiprocessor_count: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raise_if_gpu_gone(answer: Answer) -> None:
    if answer.code == GPU_IS_LOST or answer.code in UNAVAILABLE:
        raise answer.error()


def _v1_name(constant: int, info: Any) -> str:
    """The version-1 struct has no name: nvidia-smi's ``<g>g.<GiB rounded up>gb`` plus the
    media suffix of the constant (A100/A30 names come out exact; [verify] elsewhere)."""
    gib = math.ceil(int(info.memorySizeMB) / 1024)
    return f"{int(info.sliceCount)}g.{gib}gb{_MEDIA_SUFFIX.get(constant, '')}"


def ci_preference(profile: CiProfileInfo) -> tuple[int, int, int]:
    """Sort key, best first: most SMs, then most slices, then the lower constant.

    A two-memory-slice ``1g`` GI on Hopper offers ``1_SLICE`` (16 SMs) and ``1_SLICE_REV1``
    (26 SMs, go-nvml#146); "first wins on slices" took the 16 (review D8).
    """
    return (-profile.multiprocessor_count, -profile.slices, profile.constant)


class MigReader:
    """Reads (never changes) the MIG state of GPUs, with the version fallbacks remembered."""

    def __init__(self, nv: Nvml) -> None:
        self._nv = nv
        self._gi_version = 2
        self._ci_version = 2
        self._infos: dict[str, tuple[bool, list[GiProfileInfo]]] = {}
        self._placements: dict[str, tuple[bool, list[ProfilePlacements]]] = {}

    def forget(self, gpu: str | None = None) -> None:
        """Drop what is cached (for one GPU, or all): after a mode change or a reset."""
        for cache in (self._infos, self._placements):
            if gpu is None:
                cache.clear()
            else:
                cache.pop(gpu, None)

    # -- GPU-instance profiles -------------------------------------------------------------

    def _versioned(self, name: str, attr: str, *args: Any) -> Answer:
        version: int = getattr(self, attr)
        answer = self._nv.attempt(name, *args, version)
        if answer.code == FUNCTION_NOT_FOUND and version == 2:
            # Before R510 only the v1 symbol exists (go-nvml b09a8f3 vs 15056a1).
            setattr(self, attr, 1)
            answer = self._nv.attempt(name, *args, 1)
        return answer

    def gi_profile_answer(self, handle: Any, constant: int) -> Answer:
        """``nvmlDeviceGetGpuInstanceProfileInfo(V)`` for one ``NVML_GPU_INSTANCE_PROFILE_*``."""
        return self._versioned(
            "nvmlDeviceGetGpuInstanceProfileInfo", "_gi_version", handle, constant
        )

    def gi_profiles(self, gpu: str, handle: Any, mig_on: bool) -> list[GiProfileInfo]:
        """Every GPU-instance profile NVML describes now; cached only when complete."""
        return self._gi_profiles(gpu, handle, mig_on)[0]

    def _gi_profiles(self, gpu: str, handle: Any, mig_on: bool) -> tuple[list[GiProfileInfo], bool]:
        cached = self._infos.get(gpu)
        if cached is not None and cached[0] == mig_on:
            return cached[1], True
        out: list[GiProfileInfo] = []
        complete = True
        count = self._nv.constant("NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)
        for constant in range(count):
            answer = self.gi_profile_answer(handle, constant)
            _raise_if_gpu_gone(answer)
            if answer.ok:
                out.append(self._gi_info(constant, answer.value))
            elif answer.code not in NO_SUCH_PROFILE:
                complete = False
                logger.info("GPU %s profile constant %d unreadable: %s", gpu, constant, answer.text)
        if out and complete:
            self._infos[gpu] = (mig_on, out)
        return out, bool(out) and complete

    @staticmethod
    def _gi_info(constant: int, info: Any) -> GiProfileInfo:
        memory_mib = int(info.memorySizeMB)
        raw = _text(getattr(info, "name", b""))
        return GiProfileInfo(
            constant=constant,
            id=int(info.id),
            raw_name=raw,
            name=normalize_profile_name(raw) or _v1_name(constant, info),
            slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessor_count=int(getattr(info, "multiprocessorCount", 0)),
            memory_mib=memory_mib,
        )

    def placements_answer(self, handle: Any, profile_id: int) -> Answer:
        """``nvmlDeviceGetGpuInstancePossiblePlacements`` (C ``_v2``; caller-allocated array)."""
        array = (self._nv.module.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        answer = self._nv.attempt(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            handle,
            profile_id,
            array,
            ctypes.byref(count),
        )
        if not answer.ok:
            return answer
        return Answer(tuple((int(array[i].start), int(array[i].size)) for i in range(count.value)))

    def possible_placements(self, gpu: str, handle: Any, mig_on: bool) -> list[ProfilePlacements]:
        """Profiles with their placements (``nvidia-smi mig -lgipp``), skipping unreadable ones."""
        cached = self._placements.get(gpu)
        if cached is not None and cached[0] == mig_on:
            return cached[1]
        infos, complete = self._gi_profiles(gpu, handle, mig_on)
        out: list[ProfilePlacements] = []
        for info in infos:
            answer = self.placements_answer(handle, info.id)
            _raise_if_gpu_gone(answer)
            if not answer.ok:
                complete = False
                logger.info("GPU %s profile %d placements: %s", gpu, info.id, answer.text)
            elif answer.value:
                out.append(self._profile(info, answer.value))
        out.sort(key=lambda p: p.profile_id)
        if out and complete:
            self._placements[gpu] = (mig_on, out)
        return out

    @staticmethod
    def _profile(info: GiProfileInfo, placements: tuple[tuple[int, int], ...]) -> ProfilePlacements:
        return ProfilePlacements(
            profile_id=info.id,
            name=info.name,
            compute_slices=info.slices,
            memory_slices=placements[0][1],
            memory_mib=info.memory_mib,
            max_instances=info.instance_count,
            placements=placements,
        )

    # -- instances -------------------------------------------------------------------------

    def gpu_instances(self, gpu: str, handle: Any, mig_on: bool) -> list[tuple[Any, Any]]:
        """``(GI handle, nvmlGpuInstanceGetInfo)`` for every GI NVML lists (``mig -lgi``)."""
        out: list[tuple[Any, Any]] = []
        for info in self.gi_profiles(gpu, handle, mig_on):
            size = max(info.instance_count, MIN_INSTANCE_ARRAY)
            array = (self._nv.module.c_nvmlGpuInstance_t * size)()
            count = ctypes.c_uint(size)
            answer = self._nv.attempt(
                "nvmlDeviceGetGpuInstances", handle, info.id, array, ctypes.byref(count)
            )
            _raise_if_gpu_gone(answer)
            if not answer.ok:
                logger.info("GPU %s GIs of profile %d: %s", gpu, info.id, answer.text)
                continue
            for i in range(count.value):
                gi_info = self._nv.attempt("nvmlGpuInstanceGetInfo", array[i])
                if gi_info.ok:
                    out.append((array[i], gi_info.value))
        return out

    def ci_profile_answer(self, gi: Any, constant: int) -> Answer:
        """``nvmlGpuInstanceGetComputeInstanceProfileInfo(V)`` for one CI-profile constant."""
        return self._versioned(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo", "_ci_version", gi, constant, 0
        )

    def ci_profiles(self, gi: Any) -> list[CiProfileInfo]:
        """Every compute-instance profile the GI offers (``nvidia-smi mig -lcip``)."""
        out = []
        count = self._nv.constant("NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9)
        for constant in range(count):
            answer = self.ci_profile_answer(gi, constant)
            _raise_if_gpu_gone(answer)
            if answer.ok:
                info = answer.value
                out.append(
                    CiProfileInfo(
                        constant=constant,
                        id=int(info.id),
                        name=normalize_profile_name(_text(getattr(info, "name", b""))),
                        slices=int(info.sliceCount),
                        instance_count=int(info.instanceCount),
                        multiprocessor_count=int(getattr(info, "multiprocessorCount", 0)),
                    )
                )
        return out

    def compute_instances(self, gi: Any) -> list[tuple[int, int, int]]:
        """``(CI id, CI profile id, start)`` of every compute instance in a GI (``mig -lci``)."""
        found: set[tuple[int, int, int]] = set()
        for profile in self.ci_profiles(gi):
            size = max(profile.instance_count, MIN_INSTANCE_ARRAY)
            array = (self._nv.module.c_nvmlComputeInstance_t * size)()
            count = ctypes.c_uint(size)
            answer = self._nv.attempt(
                "nvmlGpuInstanceGetComputeInstances", gi, profile.id, array, ctypes.byref(count)
            )
            if not answer.ok:
                continue
            for i in range(count.value):
                info = self._nv.attempt("nvmlComputeInstanceGetInfo", array[i])
                if info.ok:
                    start = int(info.value.placement.start)
                    found.add((int(info.value.id), profile.id, start))
        return sorted(found)

    def mig_devices(self, handle: Any) -> dict[tuple[int, int], Any]:
        """MIG device handles by ``(gi, ci)``; empty indices are skipped as go-nvlib does."""
        out: dict[tuple[int, int], Any] = {}
        count = self._nv.field("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        for i in range(int(count)):
            answer = self._nv.attempt("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if answer.code == GPU_IS_LOST:
                raise GpuLost(answer.text)
            if not answer.ok:
                if answer.code not in (NOT_FOUND, INVALID_ARGUMENT):
                    logger.debug("%s", answer.text)
                continue
            gi = self._nv.field("nvmlDeviceGetGpuInstanceId", answer.value)
            ci = self._nv.field("nvmlDeviceGetComputeInstanceId", answer.value)
            if gi is not None and ci is not None:
                out[(int(gi), int(ci))] = answer.value
        return out
