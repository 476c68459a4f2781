"""``python manage.py fleet_upgrade_check [--json]``: run with the new code before ``migrate``.
Exit status 1 when an enrolled agent would be refused by the new server (upgrade it first)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.commands.upgrade_check import upgrade_report


class Command(BaseCommand):
    help = (
        "Before migrating: what the pending migrations do, and whether every enrolled agent is "
        "served by this version (exit 1 if one would be refused)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = upgrade_report()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self._text(report)
        if not report["ok"]:
            raise SystemExit(1)

    def _text(self, report: dict[str, Any]) -> None:
        out = self.stdout.write
        low, high = report["served_protocols"]
        out(f"This version's server speaks agent protocol {high} and serves {low} and {high}.")
        migrations = report["migrations"]
        out(f"\nMigrations to apply: {len(migrations) or 'none'}")
        for m in migrations:
            flag = "" if m["reversible"] else "  (irreversible: back up first)"
            out(f"  {m['name']}{flag}")
            for operation in m["operations"]:
                out(f"    - {operation}")
        agents = report["agents"]
        out(f"\nAgents: {agents['total']} enrolled, {agents['served']} served")
        for a in agents["refused"]:
            out(self.style.ERROR(f"  {a['host']}: {a['problem']}"))
        for a in agents["unknown"]:
            out(self.style.WARNING(f"  {a['host']}: {a['problem']}"))
        verdict = "OK to upgrade" if report["ok"] else "NOT OK: upgrade the agents above first"
        out(("\n" + verdict) if report["ok"] else self.style.ERROR("\n" + verdict))
