"""``python manage.py secrets_key``: print a new key for ``FLEET_SECRETS_KEY``;
``--rotate``: re-encrypt every team secret (and every webhook's URL and secret) with the first
configured key.

Rotation: set ``FLEET_SECRETS_KEY=<new>,<old>`` (the first encrypts, every one decrypts), run
``manage.py secrets_key --rotate``, then drop ``<old>``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.core.secrets import secrets_reencrypt
from fleet.settings.secret_key import new_fernet_key


class Command(BaseCommand):
    help = "Print a new FLEET_SECRETS_KEY key, or re-encrypt every team secret (--rotate)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="re-encrypt every team secret and webhook credential with the first key of "
            "FLEET_SECRETS_KEY",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["rotate"]:
            self.stdout.write(new_fernet_key())
            return
        done, unreadable = secrets_reencrypt()
        self.stdout.write(f"{done} secret(s) and webhook(s) re-encrypted with the first key.")
        if unreadable:
            raise CommandError(
                f"{unreadable} secret(s) could not be decrypted by any key (see the log): "
                "keep the key that encrypted them in FLEET_SECRETS_KEY."
            )
