"""Token prefixes tell tokens apart; tokens issued before the prefix fix keep working."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from fleet.core.models import ApiToken
from fleet.core.services import api_token_create
from fleet.core.tokens import new_token, token_lookup_prefixes, token_prefix


def test_a_thousand_new_tokens_all_get_a_non_empty_prefix():
    for _ in range(1000):
        secret = new_token("fla")
        assert re.fullmatch(r"[0-9a-f]{8}", token_prefix(secret)), secret
        assert secret.startswith(f"fla_{token_prefix(secret)}_")


def test_underscores_in_the_random_part_do_not_hide_the_prefix():
    assert token_prefix("fla_0123abcd_x_y__z") == "0123abcd"
    assert token_prefix("fle_89abcdef_") == "89abcdef"
    assert token_prefix("no-separators") == ""


def test_lookups_also_accept_the_empty_prefix_stored_before_the_fix():
    assert token_lookup_prefixes("fla_0123abcd_x_y") == ["", "0123abcd"]
    assert token_lookup_prefixes("fla_0123abcd_xy") == ["0123abcd"]


@pytest.mark.django_db
def test_every_token_a_user_creates_stores_its_prefix(viewer):
    tokens = [api_token_create(user=viewer, name=f"t{i}") for i in range(40)]
    assert all(token.prefix == token_prefix(secret) != "" for token, secret in tokens)


@pytest.mark.django_db
def test_a_token_stored_with_the_old_empty_prefix_still_authenticates(viewer):
    token, secret = api_token_create(user=viewer, name="old")
    ApiToken.objects.filter(pk=token.pk).update(prefix="")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    assert client.get("/api/v1/me").json()["username"] == viewer.username
