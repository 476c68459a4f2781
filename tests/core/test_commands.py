"""Management commands: tokens with an expiry from the command line; demo accounts that do not
share a password."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command
from django.utils import timezone

from fleet.core.models import ApiToken
from fleet.core.roles import Role, role_of

pytestmark = pytest.mark.django_db


def create_token(*args: str) -> str:
    out = StringIO()
    call_command("create_api_token", *args, stdout=out)
    return out.getvalue().strip()


def test_create_api_token_can_give_the_token_an_expiry():
    secret = create_token("ci-bot", "--role", "viewer", "--expires-in-days", "7")
    token = ApiToken.objects.get(user__username="ci-bot")
    assert secret.startswith(f"fla_{token.prefix}_")
    assert token.expires_at is not None
    assert abs(token.expires_at - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    create_token("ci-bot", "--name", "forever")
    assert ApiToken.objects.get(name="forever").expires_at is None


def test_create_api_token_explains_a_refusal(settings):
    with pytest.raises(CommandError, match="between 1 and 3650"):
        create_token("ci-bot", "--role", "viewer", "--expires-in-days", "0")
    settings.FLEET_MAX_API_TOKENS_PER_USER = 1
    create_token("ci-bot")
    with pytest.raises(CommandError, match="the most allowed"):
        create_token("ci-bot")


def test_each_demo_account_gets_a_password_of_its_own():
    from fleet.commands.management.commands.demo import demo_accounts_reset

    passwords = demo_accounts_reset()
    assert set(passwords) == {"admin", "operator", "viewer"}
    assert len(set(passwords.values())) == 3
    for name, role in (("admin", Role.ADMIN), ("operator", Role.OPERATOR), ("viewer", Role.VIEWER)):
        user = authenticate(username=name, password=passwords[name])
        assert user is not None and role_of(user) is role
        others = [pw for other, pw in passwords.items() if other != name]
        assert all(authenticate(username=name, password=pw) is None for pw in others)
    again = demo_accounts_reset()
    assert authenticate(username="viewer", password=passwords["viewer"]) is None
    assert authenticate(username="viewer", password=again["viewer"]) is not None


def test_the_demo_fleet_runs_its_process_workload_under_a_policy_as_a_non_root_user():
    from fleet.allocations.models import Allocation, Deployment
    from fleet.commands.demo_fleet import demo_process_user, seed_demo_fleet
    from fleet.core.models import Operation
    from fleet.core.policy import effective_policy
    from fleet.inventory.models import Host

    seed_demo_fleet()

    worker = Deployment.objects.get(name="feature-worker")
    policy = effective_policy(worker.team.policy)
    assert "process" in policy["runtimes"]
    assert policy["process_user"] == demo_process_user()
    assert not demo_process_user().startswith("0:")
    assert Allocation.objects.filter(deployment=worker).count() == 2
    assert not Host.objects.filter(process_runtime=False).exists()
    assert Operation.objects.filter(kind="set_policy").count() == 1
