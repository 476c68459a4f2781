"""deploy/compose/: the Compose file runs every role of the image (the top-level Dockerfile) by
its command, in order (migrate first), against its own PostgreSQL and Redis, behind Caddy; its
fleet.env.example sets what production requires, and the same credentials on both sides.
`docker compose config` (or docker-compose) and `caddy validate` check them in deploy/check.sh;
this reads their structure with no tool at all."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE = ROOT / "deploy" / "compose"
ENTRYPOINT = ROOT / "deploy" / "container" / "entrypoint"
ROLES = ("migrate", "web", "worker", "beat", "gateway")


def services() -> dict[str, Any]:
    found = yaml.safe_load((COMPOSE / "compose.yaml").read_text(encoding="utf-8"))
    return dict(found["services"])


def example() -> dict[str, str]:
    text = (COMPOSE / "fleet.env.example").read_text(encoding="utf-8")
    return dict(line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")


def test_one_image_runs_every_role_by_its_command() -> None:
    found = services()
    assert {"postgres", "redis", "caddy", *ROLES} <= set(found)
    entrypoint = ENTRYPOINT.read_text(encoding="utf-8")
    for role in ROLES:
        service = found[role]
        assert service["command"] == [role]
        assert re.search(rf"^\s+{role}\)", entrypoint, re.M), f"the image has no {role} role"
        assert service["image"] == found["web"]["image"]
        build = service["build"]
        assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"
        assert service["env_file"] == "fleet.env"
    # migrate runs once, on a healthy database; the others start after it succeeded.
    assert found["migrate"]["restart"] == "no"
    assert found["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for role in ("web", "worker", "beat", "gateway"):
        after = found[role]["depends_on"]
        assert after["migrate"]["condition"] == "service_completed_successfully"
        assert after["redis"]["condition"] == "service_healthy"
    # Only the proxy and the gateway publish ports; the web containers are the proxy's.
    published = {name for name, service in found.items() if service.get("ports")}
    assert published == {"caddy", "gateway"}


def test_the_proxy_reaches_the_web_containers_with_the_repositorys_settings() -> None:
    caddyfile = (COMPOSE / "Caddyfile").read_text(encoding="utf-8")
    entrypoint = ENTRYPOINT.read_text(encoding="utf-8")
    port = re.search(r"FLEET_PORT:-(\d+)", entrypoint)
    assert port
    assert re.search(rf"dynamic a web {port.group(1)}\b", caddyfile)
    caddy = services()["caddy"]
    assert "./Caddyfile:/etc/caddy/Caddyfile:ro" in caddy["volumes"]
    assert {"80:80", "443:443"} <= set(caddy["ports"])
    # The request body limit is the repository's proxies' (FLEET_MAX_REQUEST_BYTES, 8 MiB).
    assert "max_size 8MB" in caddyfile
    assert "max_size 8MB" in (ROOT / "deploy" / "caddy" / "Caddyfile").read_text(encoding="utf-8")


def test_the_environment_file_sets_what_production_requires_consistently() -> None:
    settings = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "fleet" / "settings").glob("*.py"))
    )
    required = set(re.findall(r'require\("(FLEET_[A-Z_]+)"\)', settings))
    values = example()
    assert required <= set(values), required - set(values)
    for name in values:
        if name.startswith("FLEET_") and name != "FLEET_HOSTNAME":  # FLEET_HOSTNAME: Caddy's
            assert name in settings, f"{name} is not a setting"
    assert values["FLEET_SECURE_PROXY_SSL_HEADER"] == "HTTP_X_FORWARDED_PROTO,https"
    assert values["FLEET_NUM_PROXIES"] == "1"
    database = urllib.parse.urlsplit(values["FLEET_DATABASE_URL"])
    assert (database.hostname, database.port) == ("postgres", 5432)
    assert database.username == values["POSTGRES_USER"]
    assert database.password == values["POSTGRES_PASSWORD"]
    assert database.path == "/" + values["POSTGRES_DB"]
    redis = urllib.parse.urlsplit(values["FLEET_REDIS_URL"])
    assert (redis.hostname, redis.password) == ("redis", values["REDIS_PASSWORD"])
    host = values["FLEET_HOSTNAME"]
    assert values["FLEET_ALLOWED_HOSTS"] == host
    assert values["FLEET_CSRF_TRUSTED_ORIGINS"] == f"https://{host}"
    assert "{$FLEET_HOSTNAME}" in (COMPOSE / "Caddyfile").read_text(encoding="utf-8")
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "deploy/compose/fleet.env" in ignored, "the filled-in settings must not be committed"
