"""Local accounts keep working beside single sign-on; FLEET_LOCAL_LOGIN=off leaves only the
break-glass user signing in by password (dashboard and admin alike), and API tokens as they
were."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from fleet.core.models import ApiToken
from fleet.core.tokens import hash_token, new_token

pytestmark = pytest.mark.django_db


def local(make_user: Any, role: str, name: str) -> Any:
    user = make_user(role, name)
    user.set_password(f"{name}-password-1")
    user.save()
    return user


def post_sign_in(path: str, name: str) -> int:
    response = Client().post(path, {"username": name, "password": f"{name}-password-1"})
    return int(response.status_code)


def test_local_accounts_sign_in_by_default(make_user):
    local(make_user, "operator", "olga")
    assert post_sign_in("/login/", "olga") == 302


def test_with_local_login_off_only_the_break_glass_user_signs_in_by_password(settings, make_user):
    settings.FLEET_LOCAL_LOGIN = False
    settings.FLEET_BREAK_GLASS_USER = "root"
    olga = local(make_user, "operator", "olga")
    root = local(make_user, "admin", "root")
    root.is_staff = root.is_superuser = True
    root.save()
    key = new_token("fla")
    ApiToken.objects.create(user=olga, name="ci", prefix="x", key_hash=hash_token(key))

    assert post_sign_in("/login/", "olga") == 200  # the form again
    assert post_sign_in("/admin/login/", "olga") == 200
    assert post_sign_in("/login/", "root") == 302
    assert post_sign_in("/admin/login/", "root") == 302
    assert Client().get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
