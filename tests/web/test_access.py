"""Every dashboard page and fragment, and the API schema and docs, need a role: a signed-in user
without one gets the 403 "no access" page, and can still sign out."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import URLPattern, reverse

from fleet.web import urls as web_urls

pytestmark = pytest.mark.django_db

# The only dashboard URLs a user without a role may use.
OPEN_TO_EVERY_USER = {"login", "logout"}
# Pages for admins only (tests/web/test_alerts_page.py).
ADMINS_ONLY = {"alerts"}


def every_dashboard_url(fleet: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, URL) of every pattern in fleet/web/urls.py: a new page is walked automatically,
    each id its real object's (ids differ per table on PostgreSQL)."""
    ids = {
        "gpu_id": fleet["mig"].pk,
        "deployment_id": fleet["deployment"].pk,
        "host_id": fleet["host"].pk,
        "team_id": fleet["deployment"].team_id,
    }
    found = []
    for pattern in web_urls.urlpatterns:
        assert isinstance(pattern, URLPattern) and pattern.name, pattern
        names = pattern.pattern.converters
        assert set(names) <= set(ids), f"{pattern.name}: give the test an id for {set(names)}"
        kwargs: dict[str, Any] = {name: ids[name] for name in names}
        found.append((pattern.name, reverse(f"web:{pattern.name}", kwargs=kwargs)))
    return found


def test_every_dashboard_url_refuses_a_user_without_a_role(nobody_web, small_fleet):
    urls = every_dashboard_url(small_fleet)
    assert {name for name, _ in urls} >= OPEN_TO_EVERY_USER | {"fleet", "ui-cards"}
    for name, url in urls:
        if name in OPEN_TO_EVERY_USER:
            continue
        response = nobody_web.get(url)
        assert response.status_code == 403, (name, url, response.status_code)
        assert b'id="no-access"' in response.content, name


def test_every_dashboard_url_opens_for_a_viewer(viewer_web, small_fleet):
    for name, url in every_dashboard_url(small_fleet):
        if name in ADMINS_ONLY:
            assert viewer_web.get(url).status_code == 403, (name, url)
        elif name not in OPEN_TO_EVERY_USER:
            assert viewer_web.get(url).status_code == 200, (name, url)


def test_the_no_access_page_says_why_and_offers_to_sign_out(nobody_web, nobody):
    page = nobody_web.get("/").content.decode()
    assert "No access" in page and nobody.username in page
    assert "holds no Fleet role" in page and 'action="/logout/"' in page
    assert nobody_web.post("/logout/").status_code == 302
    assert nobody_web.get("/").status_code == 302  # signed out: to the sign-in page


def test_a_signed_in_user_without_a_role_lands_on_the_no_access_page(client, nobody):
    from tests.web.conftest import PASSWORD

    response = client.post("/login/", {"username": nobody.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(response["Location"]).status_code == 403


def test_the_api_schema_and_docs_refuse_a_user_without_a_role(nobody_web, viewer_web):
    assert nobody_web.get("/api/schema/").status_code == 403
    docs = nobody_web.get("/api/docs/")
    assert docs.status_code == 403 and b'id="no-access"' in docs.content
    assert viewer_web.get("/api/schema/").status_code == 200
    assert viewer_web.get("/api/docs/").status_code == 200
