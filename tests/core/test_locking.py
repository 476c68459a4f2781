"""Background writes (heartbeats, telemetry checkpoints) never wait for a row the control plane
holds, so they cannot stall behind, or deadlock with, a drain or a placement: the held row is
skipped and written at the next round."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from fleet.agents.last_seen import hosts_seen
from fleet.core.locking import lock_available
from fleet.inventory.models import Host
from fleet.inventory.services import host_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")


def _hold(host_id: int, locked: threading.Event, release: threading.Event) -> threading.Thread:
    """Another transaction (a drain, say) holds the host's row until ``release``."""

    def run() -> None:
        try:
            with transaction.atomic():
                Host.objects.select_for_update().get(pk=host_id)
                locked.set()
                release.wait(10)
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=run)
    thread.start()
    assert locked.wait(10)
    return thread


def test_a_heartbeat_skips_a_host_another_transaction_holds_and_waits_for_none():
    busy, _ = host_create(name="busy")
    idle, _ = host_create(name="idle")
    Host.objects.update(last_seen_at=None)
    locked, release = threading.Event(), threading.Event()
    thread = _hold(busy.pk, locked, release)
    try:
        skipped: list[int] = []
        started = time.monotonic()
        hosts_seen([busy.pk, idle.pk], skipped=skipped)
        assert time.monotonic() - started < 2  # it did not wait for the lock
        assert skipped == [busy.pk]
        assert Host.objects.get(pk=idle.pk).last_seen_at is not None
        assert Host.objects.get(pk=busy.pk).last_seen_at is None
    finally:
        release.set()
        thread.join()
    hosts_seen([busy.pk])  # the next round writes it
    assert Host.objects.get(pk=busy.pk).last_seen_at is not None


def test_lock_available_returns_the_free_rows_in_key_order():
    hosts = [host_create(name=f"h{i}")[0] for i in range(3)]
    locked, release = threading.Event(), threading.Event()
    thread = _hold(hosts[1].pk, locked, release)
    try:
        with transaction.atomic():
            assert lock_available(Host, [hosts[2].pk, hosts[0].pk, hosts[1].pk]) == [
                hosts[0].pk,
                hosts[2].pk,
            ]
            assert lock_available(Host, []) == []
    finally:
        release.set()
        thread.join()
