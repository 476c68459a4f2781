"""Host tokens: looked up by prefix and hash, including rows stored before prefixes were fixed."""

from __future__ import annotations

import pytest

from fleet.agents.enrollment import host_authenticate
from fleet.core.tokens import hash_token, legacy_token_prefix
from fleet.inventory.models import Host
from fleet.inventory.services import host_create

pytestmark = pytest.mark.django_db


def test_a_host_enrolled_with_a_legacy_empty_prefix_still_authenticates():
    host, _ = host_create(name="old")
    token = "flh_0123abcd_random_part_with_underscores"
    assert legacy_token_prefix(token) == ""
    Host.objects.filter(pk=host.pk).update(token_prefix="", token_hash=hash_token(token))
    assert host_authenticate(token) == host
    assert host_authenticate(token + "x") is None


def test_a_revoked_host_token_matches_nothing():
    host, _ = host_create(name="gone")
    Host.objects.filter(pk=host.pk).update(token_prefix="", token_hash="")
    assert host_authenticate("flh_0123abcd_x") is None
    assert host_authenticate("flh__") is None
