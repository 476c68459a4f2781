"""Health events are kept FLEET_HEALTH_EVENTS_KEEP_DAYS (30 by default), then deleted by beat."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.inventory.models import HealthEvent
from fleet.inventory.services import health_events_prune, host_create
from fleet.tasks import prune_health_events

pytestmark = pytest.mark.django_db


def test_health_events_older_than_the_retention_are_deleted_and_newer_ones_kept(settings):
    host, _ = host_create(name="h")
    now = timezone.now()
    for days in (0, 29, 31, 400):
        HealthEvent.objects.create(host=host, kind="xid", xid=79, ts=now - timedelta(days=days))
    assert health_events_prune(now) == 2
    assert sorted((now - e.ts).days for e in HealthEvent.objects.all()) == [0, 29]
    settings.FLEET_HEALTH_EVENTS_KEEP_DAYS = 1
    assert prune_health_events() == 1
