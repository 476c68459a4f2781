"""The group map: a pure parser that refuses bad configuration with a message naming the
group, and the grants a user's groups give (highest role wins, case-insensitive names)."""

from __future__ import annotations

import pytest

from fleet.core.sso.mapping import (
    Grants,
    GroupMapError,
    TeamGrant,
    grants_for,
    group_map_parse,
)

MAP = group_map_parse(
    '{"gpu-admins": "admin", "GPU-Viewers": "viewer",'
    ' "team-search": {"team": "search", "role": "operator"},'
    ' "search-readers": {"team": "search"},'
    ' "ml-leads": ["operator", {"team": "ml", "role": "operator"}]}'
)


def test_an_empty_map_grants_nothing():
    assert grants_for(["gpu-admins"], group_map_parse("")) == Grants(role=None, teams={})


def test_the_issue_example_maps_a_role_and_a_team_role():
    example = group_map_parse(
        '{"gpu-admins": "admin", "team-search": {"team": "search", "role": "operator"}}'
    )
    assert grants_for(["gpu-admins"], example) == Grants(role="admin", teams={})
    assert grants_for(["team-search"], example) == Grants(role=None, teams={"search": "operator"})


def test_the_highest_fleet_role_and_the_highest_team_role_win():
    grants = grants_for(["gpu-viewers", "ml-leads", "search-readers", "team-search"], MAP)
    assert grants == Grants(role="operator", teams={"search": "operator", "ml": "operator"})


def test_group_names_match_whatever_their_case_and_unknown_groups_grant_nothing():
    assert grants_for(["Gpu-Admins", "strangers"], MAP) == Grants(role="admin", teams={})
    assert grants_for(["gpu-viewers"], MAP).role == "viewer"


def test_a_team_grant_defaults_to_viewer_and_every_named_team_is_managed():
    assert MAP.teams["search-readers"] == (TeamGrant(team="search", role="viewer"),)
    assert MAP.managed_teams == frozenset({"search", "ml"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["admin"]', "must be a JSON object"),
        ('{"g": "root"}', "'root' is not a fleet role"),
        ('{"g": {"team": "search", "role": "admin"}}', "team role 'admin'"),
        ('{"g": {"team": "Search Team"}}', "is not a team slug"),
        ('{"g": {"role": "viewer"}}', "a grant is a fleet role or"),
        ('{"g": {"team": "a", "extra": 1}}', "a grant is a fleet role or"),
        ('{"g": 3}', "a grant is a fleet role or"),
        ('{"G": "admin", "g": "viewer"}', "twice"),
        ('{" ": "admin"}', "empty or too long"),
    ],
)
def test_a_bad_map_is_refused_with_a_message_naming_the_problem(raw, message):
    with pytest.raises(GroupMapError, match=message):
        group_map_parse(raw)
