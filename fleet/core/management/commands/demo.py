"""``python manage.py demo``: migrate, seed the demo fleet, print a login, serve on :8000."""

from __future__ import annotations

import secrets
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from fleet.core.roles import Role
from fleet.core.services import user_create
from fleet.inventory.demo import seed_demo_fleet


class Command(BaseCommand):
    help = "Run the whole product on embedded defaults with a demo fleet (http://127.0.0.1:8000)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="127.0.0.1:8000", help="address:port to serve on")
        parser.add_argument(
            "--no-serve", action="store_true", help="seed and print the login, then exit"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        seeded = seed_demo_fleet()
        password = secrets.token_urlsafe(12)
        user_create(username="admin", password=password, role=Role.ADMIN)
        user_create(username="operator", password=password, role=Role.OPERATOR)
        user_create(username="viewer", password=password, role=Role.VIEWER)
        url = f"http://{options['addr']}"
        self.stdout.write(
            self.style.SUCCESS(f"Fleet demo: {seeded['hosts']} hosts.")
            + f"\n  Open {url}/  (API docs {url}/api/docs/, admin {url}/admin/)"
            + f"\n  Log in as admin / operator / viewer with password: {password}\n"
        )
        if options["no_serve"]:
            return
        call_command("runserver", options["addr"], use_reloader=False, insecure_serving=True)
