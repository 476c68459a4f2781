"""What a reader may not see, taken out: URLs without credentials or query strings, workloads
as their runtime only, operation payloads without workload specs; and who sees a team's specs
(:func:`fleet.core.teams.can_see_spec`, the member role)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from fleet.core.models import Team, TeamMembership
from fleet.core.redaction import payload_redacted, redact_url, urls_redacted, workload_redacted
from fleet.core.roles import Role, role_of
from fleet.core.teams import can_see_spec


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://ops:hunter2@hooks.slack.com/services/T0/B0/X?token=abc#frag",
            "https://hooks.slack.com/services/T0/B0/X",
        ),
        (
            "https://hooks.example.com:8443/alerts?key=s3cret",
            "https://hooks.example.com:8443/alerts",
        ),
        ("http://user@host", "http://host"),
        ("http://h:8080?x=1", "http://h:8080"),
        ("http://[::1]:9/p", "http://[::1]:9/p"),
        ("https://a@b@host/p@q/r?s", "https://host/p@q/r"),
        ("http://[broken", "http://[broken"),  # no ValueError from a malformed host
        ("https://hooks.example.com/plain", "https://hooks.example.com/plain"),
    ],
)
def test_a_redacted_url_keeps_scheme_host_port_and_path_only(url, shown):
    assert redact_url(url) == shown


def test_every_url_in_a_text_is_redacted_and_the_rest_kept():
    text = 'Alert webhook #1 created: https://u:p@h.example/x?k=v, and "http://a:b@c/d". Done'
    assert (
        urls_redacted(text)
        == 'Alert webhook #1 created: https://h.example/x, and "http://c/d". Done'
    )
    assert urls_redacted("no link here") == "no link here"


def test_a_redacted_workload_is_its_runtime_marked_redacted():
    workload = {"runtime": "container", "image": "x", "command": ["a"], "env": {"K": "v"}}
    assert workload_redacted(workload) == {"runtime": "container", "redacted": True}
    assert workload_redacted(None) == {"runtime": "none", "redacted": True}


def test_a_payload_loses_its_workloads_and_spec_parts_and_keeps_the_rest():
    payload = {
        "step": "rolling",
        "workload": {"runtime": "process", "command": ["serve"], "env": {"K": "digest"}},
        "previous": {"runtime": "process", "command": ["old"]},
        "sealed_previous": "ciphertext",
        "env": {"K": "v"},
        "done": [1],
    }
    assert payload_redacted(payload) == {
        "step": "rolling",
        "workload": {"runtime": "process", "redacted": True},
        "previous": {"runtime": "process", "redacted": True},
        "done": [1],
    }


def test_a_payload_without_a_spec_is_returned_as_it_was():
    payload = {"replicas": 2, "team": 3}
    assert payload_redacted(payload) is payload
    assert payload_redacted(None) is None


@pytest.mark.django_db
def test_a_team_member_holds_the_member_role_and_sees_its_own_teams_specs_only(make_user):
    alpha = Team.objects.create(name="alpha", slug="alpha")
    beta = Team.objects.create(name="beta", slug="beta")
    member = get_user_model().objects.create_user("alice", password="x-pass-1234")
    TeamMembership.objects.create(team=alpha, user=member, role="viewer")
    assert role_of(member) is Role.MEMBER
    assert Role.NONE < Role.MEMBER < Role.VIEWER
    assert can_see_spec(member, alpha.pk) and not can_see_spec(member, beta.pk)
    assert not can_see_spec(member, None)
    viewer = make_user("viewer")
    assert can_see_spec(viewer, beta.pk) and can_see_spec(viewer, None)
    stranger = get_user_model().objects.create_user("nobody", password="x-pass-1234")
    assert role_of(stranger) is Role.NONE and not can_see_spec(stranger, alpha.pk)
