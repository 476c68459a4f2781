"""``python manage.py create_api_token USER [--role R] [--name N] [--expires-in-days D]``: print
a new API token."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.core.errors import ServiceError
from fleet.core.roles import Role
from fleet.core.services import api_token_create, user_create


class Command(BaseCommand):
    help = "Create an API token for a user (creating the user with --role if missing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--role", choices=["viewer", "operator", "admin"], help="create or re-role the user"
        )
        parser.add_argument("--name", default="cli", help="a label for the token")
        parser.add_argument(
            "--expires-in-days",
            type=int,
            default=None,
            help="the token stops working after this many days (default: never)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"]
        if options["role"]:
            user = user_create(username=username, password=None, role=Role[options["role"].upper()])
        else:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"No user {username!r}; pass --role to create one.")
        try:
            _, secret = api_token_create(
                user=user, name=options["name"], expires_in_days=options["expires_in_days"]
            )
        except ServiceError as error:
            raise CommandError(error.message) from None
        self.stdout.write(secret)
