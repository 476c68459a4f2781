"""Start the test OIDC provider: ``python -m tests.sso.provider.serve STATE_DIR PORT CONFIG``.

CONFIG is JSON: ``{"client_id", "client_secret", "redirect_uris": [...], "users": {name:
{"password", "email", "groups": [...]}}}``. The provider migrates its SQLite database, creates
the users and the client, writes ``STATE_DIR/ready`` and serves on 127.0.0.1:PORT."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    state, port, config = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    os.environ["PROVIDER_STATE_DIR"] = str(state)
    os.environ["PROVIDER_ISSUER"] = f"http://127.0.0.1:{port}/o"
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.sso.provider.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0)
    _populate(config)
    (state / "ready").write_text("ok")
    run("127.0.0.1", port, get_wsgi_application(), threading=True)


def _populate(config: dict) -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    for name, spec in config["users"].items():
        user = User.objects.create_user(name, email=spec["email"], password=spec["password"])
        for group in spec["groups"]:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
    Application.objects.create(
        name="fleet",
        client_id=config["client_id"],
        client_secret=config["client_secret"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(config["redirect_uris"]),
        post_logout_redirect_uris=" ".join(config.get("post_logout_redirect_uris", [])),
        skip_authorization=True,
        algorithm=Application.RS256_ALGORITHM,
    )


if __name__ == "__main__":
    main()
