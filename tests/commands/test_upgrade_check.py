"""``manage.py fleet_upgrade_check`` (issue 26), run as an upgrade runs it: the new code against
a database not yet migrated (here: inventory taken back to before ``agent_protocol``)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from fleet.inventory.models import Host
from fleet.inventory.services import host_create

pytestmark = pytest.mark.django_db(transaction=True)


def check(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("fleet_upgrade_check", *args, stdout=out)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue()
    return 0, out.getvalue()


def enrolled(name: str, version: str, agent_protocol: int = 0) -> None:
    host, _ = host_create(name=name)
    Host.objects.filter(pk=host.pk).update(agent_version=version, agent_protocol=agent_protocol)


def test_before_migrating_it_lists_the_migrations_and_reads_agents_from_their_release():
    enrolled("old-release", "0.1.0", 1)
    enrolled("custom-build", "0.1.0+local", 1)
    host_create(name="never-connected")
    call_command("migrate", "inventory", "0011", verbosity=0)
    try:
        code, text = check("--json")
        report = json.loads(text)
        (pending,) = [m for m in report["migrations"] if m["name"].startswith("inventory.")]
        assert pending["name"] == "inventory.0012_host_agent_protocol"
        assert "Add field agent_protocol to host" in pending["operations"]
        assert report["agents"]["total"] == 2 and report["agents"]["served"] == 1
        (unknown,) = report["agents"]["unknown"]
        assert unknown["host"] == "custom-build" and "not a known release" in unknown["problem"]
        assert code == 0 and report["ok"]
    finally:
        call_command("migrate", "inventory", verbosity=0)
    assert Host.objects.get(name="custom-build").agent_protocol == 1  # the data migration


def test_an_agent_the_new_server_would_refuse_fails_the_check_with_what_to_upgrade():
    enrolled("fine", "0.2.0", 2)
    enrolled("ancient", "0.0.1", 0)
    code, text = check()
    assert code == 1
    assert "Migrations to apply: none" in text
    assert "ancient: Agent 0.0.1 speaks protocol 0" in text and "upgrade the agent" in text
    assert "NOT OK" in text
