"""Error pages in Fleet's own style, not Django's bare ones (issue 27: "Delete leaves you on a
bare, unstyled Django 404"); the API keeps its JSON envelope."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/no/such/page/", "/deployments/999999/", "/gpus/999999/"])
def test_a_page_that_is_not_there_is_fleets_404(viewer_web, path):
    answer = viewer_web.get(path)
    html = answer.content.decode()
    assert answer.status_code == 404
    assert "<h1>Not found</h1>" in html and "fleet.css" in html and 'href="/"' in html


def test_the_api_still_answers_404_in_json(viewer_web):
    answer = viewer_web.get("/api/v1/no-such-thing/")
    assert answer.status_code == 404 and answer.json()["code"] == "not_found"


def test_a_server_error_is_fleets_page_and_says_nothing_changed(rf):
    from fleet.api.health import server_error

    request = rf.get("/hosts/")
    answer = server_error(request)
    html = answer.content.decode()
    assert answer.status_code == 500 and "Something went wrong" in html and "fleet.css" in html
