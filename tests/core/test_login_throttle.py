"""Password guessing on /login/ and /admin/login/ is slowed per user name and per address,
with waits that double; failed sign-ins are logged and kept for the admins, for 30 days."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.core import login_throttle
from fleet.core.login_throttle import lockout_seconds
from fleet.core.models import LoginFailure

pytestmark = pytest.mark.django_db

PASSWORD = "s3cret-pass-word"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(login_throttle, "_now", fake)
    return fake


@pytest.fixture
def two_free(settings):
    settings.FLEET_LOGIN_FREE_FAILURES = 2
    settings.FLEET_LOGIN_MAX_LOCKOUT_SECONDS = 900


def sign_in(client: Client, username: str, password: str, path: str = "/login/", **extra):
    return client.post(path, {"username": username, "password": password}, **extra)


def test_the_wait_doubles_after_the_free_failures_up_to_the_cap():
    waits = [lockout_seconds(n, free=5, max_seconds=900) for n in range(1, 18)]
    assert waits == [0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 900, 900]
    assert lockout_seconds(10**6, free=5, max_seconds=900) == 900


def test_a_name_is_locked_out_after_its_free_failures(client, viewer, clock, two_free):
    for _ in range(3):  # two free, the third starts a 1 s lockout
        response = sign_in(client, viewer.username, "wrong")
        assert response.status_code == 200 and b"do not match" in response.content
    locked = sign_in(client, viewer.username, PASSWORD)  # even the right password
    assert locked.status_code == 429
    assert locked["Retry-After"] == "1"
    assert b"Too many failed attempts; try again in 1 s." in locked.content
    assert "_auth_user_id" not in client.session
    clock.now += 1.5
    assert sign_in(client, viewer.username, "wrong").status_code == 200  # the 4th: 2 s
    clock.now += 1.0
    assert b"try again in 1 s" in sign_in(client, viewer.username, PASSWORD).content
    clock.now += 1.0
    response = sign_in(client, viewer.username, PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/"


def test_a_locked_attempt_is_not_counted_as_another_failure(client, viewer, clock, two_free):
    for _ in range(3):
        sign_in(client, viewer.username, "wrong")
    for _ in range(5):
        assert sign_in(client, viewer.username, "wrong").status_code == 429
    assert LoginFailure.objects.count() == 3


def test_signing_in_forgets_the_names_failures(client, viewer, clock, two_free):
    sign_in(client, viewer.username, "wrong")
    sign_in(client, viewer.username, "wrong")
    assert sign_in(client, viewer.username, PASSWORD).status_code == 302
    client.post("/logout/")
    for _ in range(2):  # two free failures again
        assert sign_in(client, viewer.username, "wrong").status_code == 200
    assert sign_in(client, viewer.username, PASSWORD).status_code == 302


def test_user_names_are_counted_whatever_their_case(client, viewer, clock, two_free):
    for name in ("Viewer-User", "VIEWER-USER", "viewer-user "):
        sign_in(client, name, "wrong")
    assert sign_in(client, viewer.username, PASSWORD).status_code == 429


def test_one_address_guessing_many_names_is_locked_out(client, clock, settings):
    settings.FLEET_LOGIN_FREE_FAILURES = 1  # an address gets four times as many
    for i in range(5):
        assert sign_in(client, f"guess-{i}", "wrong").status_code == 200
    assert sign_in(client, "guess-99", "wrong").status_code == 429
    other = Client(REMOTE_ADDR="198.51.100.20")
    assert sign_in(other, "guess-98", "wrong").status_code == 200


def test_behind_a_trusted_proxy_addresses_come_from_the_forwarded_header(clock, settings):
    settings.FLEET_LOGIN_FREE_FAILURES = 1
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    proxy = Client(REMOTE_ADDR="10.0.0.2")
    for i in range(5):
        sign_in(proxy, f"guess-{i}", "wrong", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert sign_in(proxy, "x", "wrong", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 429
    # Another client behind the same proxy is not locked out by the first one's guesses.
    assert sign_in(proxy, "y", "wrong", HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 200
    assert set(LoginFailure.objects.values_list("address", flat=True)) == {
        "203.0.113.7",
        "203.0.113.8",
    }


def test_the_admin_sign_in_is_locked_out_too(client, admin_user, clock, two_free):
    for _ in range(3):
        response = sign_in(client, admin_user.username, "wrong", "/admin/login/")
        assert response.status_code == 200
    locked = sign_in(client, admin_user.username, PASSWORD, "/admin/login/")
    assert locked.status_code == 429 and locked["Retry-After"] == "1"
    assert b"Too many failed attempts; try again in 1 s." in locked.content
    clock.now += 2
    assert sign_in(client, admin_user.username, PASSWORD, "/admin/login/").status_code == 302


def test_failed_sign_ins_are_logged_with_the_name_quoted_and_cut(client, caplog):
    forged = "ada\nINFO forged line" + "x" * 200
    with caplog.at_level(logging.WARNING, logger="fleet.core.services"):
        sign_in(client, forged, "wrong")
    [record] = [r for r in caplog.records if r.name == "fleet.core.services"]
    message = record.getMessage()
    assert "\n" not in message and "'ada\\nINFO forged line" in message
    assert "127.0.0.1" in message and "x" * 100 not in message


def test_failed_sign_ins_are_kept_for_the_admins_read_only(client, admin_user):
    sign_in(client, "mallory", "wrong")
    failure = LoginFailure.objects.get()
    assert (failure.username, failure.address) == ("mallory", "127.0.0.1")
    admin = Client()
    admin.force_login(admin_user)
    listing = admin.get("/admin/core/loginfailure/")
    assert listing.status_code == 200 and b"mallory" in listing.content
    assert admin.get("/admin/core/loginfailure/add/").status_code == 403
    detail = admin.get(f"/admin/core/loginfailure/{failure.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    response = admin.post(f"/admin/core/loginfailure/{failure.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403 and LoginFailure.objects.filter(pk=failure.pk).exists()


def test_failed_sign_ins_older_than_thirty_days_are_pruned(settings):
    from fleet.tasks import prune_login_failures

    now = timezone.now()
    old = LoginFailure.objects.create(username="a", at=now - timedelta(days=31))
    recent = LoginFailure.objects.create(username="b", at=now - timedelta(days=29))
    assert prune_login_failures() == 1
    assert list(LoginFailure.objects.values_list("pk", flat=True)) == [recent.pk]
    assert not LoginFailure.objects.filter(pk=old.pk).exists()
    settings.FLEET_LOGIN_FAILURES_KEEP_DAYS = 7
    assert prune_login_failures() == 1


def test_sign_in_goes_on_unthrottled_when_the_cache_is_unreachable(client, viewer, monkeypatch):
    from django.core.cache import cache

    def unreachable(*args, **kwargs):
        raise ConnectionError("cache down")

    for method in ("get_many", "add", "incr", "set", "delete_many"):
        monkeypatch.setattr(cache, method, unreachable)
    assert sign_in(client, viewer.username, "wrong").status_code == 200
    assert sign_in(client, viewer.username, PASSWORD).status_code == 302
