"""What the stack benchmarks' commands share: ``--json``, ``--database-url`` and ``--workdir``,
the check that a benchmark needing PostgreSQL has one, and the JSON they print (and write)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class StackBenchCommand(BaseCommand):
    """A benchmark that starts its own stack on loopback and prints one JSON document."""

    # What --database-url is for, in the command's help.
    database_help = "PostgreSQL server for the scratch database (default: FLEET_DATABASE_URL)"
    workdir_help = "logs and configs"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
        parser.add_argument(
            "--database-url",
            default=os.environ.get("FLEET_DATABASE_URL", ""),
            help=self.database_help,
        )
        parser.add_argument("--workdir", type=Path, default=None, help=self.workdir_help)

    def log(self, line: str) -> None:
        """Progress, on stderr: stdout is the JSON alone."""
        self.stderr.write(line)

    def require_postgres(self, options: dict[str, Any]) -> str:
        """The PostgreSQL URL, or a clear error (exit code 1) naming how to give one."""
        url = str(options["database_url"])
        if not url.startswith("postgres"):
            raise CommandError(
                f"{self.name} needs PostgreSQL: --database-url or FLEET_DATABASE_URL"
            )
        return url

    @property
    def name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def emit(self, result: Any, options: dict[str, Any]) -> None:
        text = json.dumps(result, indent=2)
        self.stdout.write(text)
        if options["json"] is not None:
            options["json"].write_text(text + "\n", encoding="utf-8")
