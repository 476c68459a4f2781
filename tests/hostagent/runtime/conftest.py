"""Fixtures of the runtime suites: a real Docker Engine with a tiny local image, and cleanup of
whatever a test left running (processes by session, containers by their host label)."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid

import pytest

from fleet.bench.image import BUSYBOX, rootfs_tar
from hostagent.protocol import LABEL_HOST

IMAGE = "fleet-test/busybox:2"


@pytest.fixture(scope="session")
def docker_client():
    """A client of the real Docker daemon, with the test image built if it is missing
    (``docker import``: no registry is needed). Skips only when no daemon answers."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker daemon answers ({exc}); CI starts one (.ci/run)")
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        if not BUSYBOX.exists():
            pytest.fail(
                f"{IMAGE} is missing and {BUSYBOX} is not here to build it (busybox-static)"
            )
        repository, tag = IMAGE.split(":")
        client.api.import_image_from_data(rootfs_tar(), repository=repository, tag=tag)
    yield client
    client.close()


@pytest.fixture
def docker_host(docker_client):
    """A hostname of this test's own (several agents share one daemon); its containers are
    removed afterwards."""
    hostname = f"test-{uuid.uuid4().hex[:10]}"
    yield hostname
    # Sparse: a supervisor's worker may still be removing one of them.
    for container in docker_client.api.containers(
        all=True, filters={"label": f"{LABEL_HOST}={hostname}"}
    ):
        with contextlib.suppress(Exception):
            docker_client.api.remove_container(container["Id"], force=True)


@pytest.fixture
def kill_sessions():
    """Register session leader PIDs; their whole sessions are killed after the test."""
    leaders: list[int] = []
    yield leaders
    for pid in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
