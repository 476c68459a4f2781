"""LDAP sign-in against a real slapd: the directory's groups set the fleet role and team
roles at each sign-in, a local account is never taken over, and the beat's sync takes the
tokens and sessions of a user the directory no longer lets in."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from fleet.core.models import ApiToken, SsoIdentity, TeamMembership
from fleet.core.roles import Role, role_of
from fleet.core.sso.ldap import ldap_users_sync
from fleet.core.tokens import hash_token, new_token
from fleet.tasks import sso_ldap_sync

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str) -> Client:
    client = Client()
    response = client.post("/login/", {"username": username, "password": password})
    assert response.status_code == 302, response.content[:500]
    return client


def team_roles(username: str) -> dict[str, str]:
    rows = TeamMembership.objects.filter(user__username=username)
    return dict(rows.values_list("team__slug", "role"))


def user(username: str) -> Any:
    return get_user_model().objects.get(username=username)


def test_an_ldap_user_signs_in_with_the_roles_of_their_groups(ldap_on):
    sign_in("alice", "alice-pw")
    sign_in("bob", "bob-pw")

    assert role_of(user("alice")) == Role.ADMIN
    assert team_roles("alice") == {"search": "operator"}
    assert role_of(user("bob")) == Role.MEMBER  # a team role only
    assert team_roles("bob") == {"search": "operator"}
    assert SsoIdentity.objects.get(user__username="bob").groups == ["team-search"]
    assert not user("alice").has_usable_password()


def test_a_group_removed_in_the_directory_removes_the_right_at_the_next_sign_in(ldap_on):
    sign_in("alice", "alice-pw")
    ldap_on.set_members("gpu-admins", [])
    ldap_on.set_members("team-search", [])

    sign_in("alice", "alice-pw")

    assert role_of(user("alice")) == Role.NONE
    assert team_roles("alice") == {}


def test_posix_groups_map_to_roles_and_a_removed_member_loses_the_right(ldap_posix_on):
    # FLEET_LDAP_GROUP_TYPE=posixGroup: membership is memberUid (the uid, not the DN).
    sign_in("alice", "alice-pw")
    assert role_of(user("alice")) == Role.ADMIN
    assert team_roles("alice") == {"search": "operator"}
    assert sorted(SsoIdentity.objects.get(user__username="alice").groups) == [
        "gpu-admins",
        "team-search",
    ]

    ldap_posix_on.set_posix_members("gpu-admins", [])
    sign_in("alice", "alice-pw")

    assert role_of(user("alice")) == Role.MEMBER  # a team role only
    assert team_roles("alice") == {"search": "operator"}


def test_a_wrong_directory_password_does_not_sign_in(ldap_on):
    response = Client().post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert not get_user_model().objects.filter(username="alice").exists()


def test_a_local_account_of_the_same_name_is_not_taken_over_by_the_directory(ldap_on, make_user):
    local = make_user("admin", "carol")
    local.set_password("local-pw-123")
    local.save()

    refused = Client().post("/login/", {"username": "carol", "password": "carol-pw"})

    assert refused.status_code == 200  # the form again: the directory password is refused
    assert not SsoIdentity.objects.filter(user=local).exists()
    sign_in("carol", "local-pw-123")  # the local password still works


def test_the_sync_revokes_the_tokens_and_sessions_of_a_user_the_directory_disabled(ldap_on):
    bob = sign_in("bob", "bob-pw")
    key = new_token("fla")
    ApiToken.objects.create(user=user("bob"), name="ci", prefix="x", key_hash=hash_token(key))
    assert Client().get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    assert bob.get("/").status_code == 200
    ldap_on.set_description("bob", "disabled")

    counts = sso_ldap_sync.apply().get()  # the beat's task, run here

    assert counts == {"synced": 0, "disabled": 1, "errors": 0}
    assert not ApiToken.objects.filter(user__username="bob").exists()
    assert not user("bob").is_active
    assert Client().get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    assert bob.get("/").status_code == 302  # the session ended: back to the sign-in page


def test_a_user_enabled_again_in_the_directory_signs_in_again(ldap_on):
    sign_in("bob", "bob-pw")
    ldap_on.set_description("bob", "disabled")
    ldap_users_sync()
    ldap_on.set_description("bob", "active")

    sign_in("bob", "bob-pw")

    assert user("bob").is_active
    assert team_roles("bob") == {"search": "operator"}


def test_the_sync_applies_group_changes_to_users_who_do_not_sign_in(ldap_on):
    sign_in("alice", "alice-pw")
    ldap_on.set_members("gpu-admins", [])

    assert ldap_users_sync() == {"synced": 1, "disabled": 0, "errors": 0}
    assert role_of(user("alice")) == Role.MEMBER


def test_a_mapped_team_is_created_at_the_first_sign_in_unless_another_team_has_its_name(
    ldap_on,
):
    from fleet.core.models import Team

    Team.objects.create(name="search", slug="search-old")

    sign_in("bob", "bob-pw")  # signs in all the same, without that team role

    assert team_roles("bob") == {}
    Team.objects.filter(slug="search-old").update(name="Search (old)")
    sign_in("bob", "bob-pw")
    assert team_roles("bob") == {"search": "operator"}


def test_an_unreachable_directory_disables_nobody(ldap_on, settings):
    sign_in("alice", "alice-pw")
    settings.AUTH_LDAP_SERVER_URI = "ldap://127.0.0.1:1"

    assert ldap_users_sync() == {"synced": 0, "disabled": 0, "errors": 1}
    assert user("alice").is_active
    assert role_of(user("alice")) == Role.ADMIN


def test_admins_see_who_signs_in_from_the_directory_in_the_admin(ldap_on, admin_user):
    sign_in("bob", "bob-pw")
    client = Client()
    client.force_login(admin_user)

    page = client.get("/admin/core/ssoidentity/")

    assert page.status_code == 200 and b"bob" in page.content
