"""The deployment files (deploy/, hostagent/packaging/): ``deploy/check.sh`` passes on them and
fails on a broken copy of each kind of file, and the units say what the server and the agent
need (the settings production requires, the hardening, the workloads' own cgroup)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
AGENT_UNITS = ROOT / "hostagent" / "packaging"
CHECK = DEPLOY / "check.sh"
TOOLS = ("systemd-analyze", "nginx", "caddy", "openssl")
missing = [
    tool for tool in TOOLS if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()
]
needs_tools = pytest.mark.skipif(
    bool(missing), reason=f"deploy/check.sh needs {', '.join(missing)} (Debian packages)"
)
SERVER_UNITS = ("fleet-web@.service", "fleet-worker.service", "fleet-beat.service")


def run_check(deploy: Path = DEPLOY, agent: Path = AGENT_UNITS) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "DEPLOY_DIR": str(deploy),
        "AGENT_UNITS": str(agent),
    }
    return subprocess.run(
        ["bash", str(CHECK)], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser


@needs_tools
def test_the_deployment_files_pass_their_checks() -> None:
    result = run_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "deploy/check.sh: ok" in result.stdout


BREAKAGES = {
    # an unknown key is only a warning to systemd: the check fails on any warning
    "a misspelt key": ("systemd/fleet-web@.service", "NoNewPrivileges=yes", "NoNewPrivilege=yes"),
    "a bad value": (
        "systemd/fleet-beat.service",
        "ProtectSystem=strict",
        "ProtectSystem=strictest",
    ),
    "a relative binary": (
        "systemd/fleet-worker.service",
        "ExecStart=/opt/fleet/venv/bin/celery",
        "ExecStart=celery",
    ),
    "a broken agent unit": (
        "agent/fleet-agent.service",
        "\nKillMode=process\n",
        "\nKillMode=processes\n",
    ),
    "nginx: a missing semicolon": ("nginx/fleet.conf", "least_conn;", "least_conn"),
    "nginx: an unknown directive": ("nginx/fleet.conf", "keepalive 32;", "keepalive_conns 32;"),
    "caddy: an unknown policy": ("caddy/Caddyfile", "lb_policy least_conn", "lb_policy fewest"),
    "caddy: not formatted": ("caddy/Caddyfile", "\tencode zstd gzip", "    encode zstd gzip"),
    "compose: an unknown condition": (
        "compose/compose.yaml",
        "condition: service_completed_successfully",
        "condition: service_finished",
    ),
}
# deploy/check.sh validates compose.yaml only where a compose command is installed.
COMPOSE_TOOL = shutil.which("docker-compose") is not None or (
    shutil.which("docker") is not None
    and subprocess.run(
        ["docker", "compose", "version"], capture_output=True, timeout=30, check=False
    ).returncode
    == 0
)


@needs_tools
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_file_fails_the_check(tmp_path: Path, breakage: str) -> None:
    name, old, new = BREAKAGES[breakage]
    if name.startswith("compose/") and not COMPOSE_TOOL:
        pytest.skip("no docker compose and no docker-compose: compose.yaml is not validated")
    deploy, agent = tmp_path / "deploy", tmp_path / "agent"
    shutil.copytree(DEPLOY, deploy)
    shutil.copytree(AGENT_UNITS, agent)
    target = tmp_path / ("" if name.startswith("agent/") else "deploy") / name
    text = target.read_text(encoding="utf-8")
    assert old in text, f"{name} no longer holds {old!r}: update this test"
    target.write_text(text.replace(old, new, 1), encoding="utf-8")
    result = run_check(deploy, agent)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL" in result.stderr and "deploy/check.sh: FAILED" in result.stderr


def test_the_environment_file_sets_every_variable_production_requires() -> None:
    settings = "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "fleet" / "settings").glob("*.py"))
    )
    required = set(re.findall(r'require\("(FLEET_[A-Z_]+)"\)', settings))
    assert {"FLEET_SECRET_KEY", "FLEET_DATABASE_URL", "FLEET_REDIS_URL"} <= required
    example = (DEPLOY / "systemd" / "fleet.env.example").read_text(encoding="utf-8")
    values = dict(
        line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#")
    )
    assert required <= set(values), required - set(values)
    assert values["FLEET_MODE"] == "production"
    # Behind the proxies of deploy/: the header they set, and the one proxy they are.
    assert values["FLEET_SECURE_PROXY_SSL_HEADER"] == "HTTP_X_FORWARDED_PROTO,https"
    assert values["FLEET_NUM_PROXIES"] == "1"
    # collectstatic writes FLEET_DATA_DIR/static, which the proxies serve.
    assert values["FLEET_DATA_DIR"] == "/var/lib/fleet"
    for name in values:
        assert name in settings or name == "FLEET_MODE", f"{name} is not a setting"


@pytest.mark.parametrize("name", SERVER_UNITS)
def test_the_server_units_are_hardened_and_use_the_entry_points(name: str) -> None:
    service = unit(DEPLOY / "systemd" / name)["Service"]
    assert service["User"] == "fleet"
    assert service["EnvironmentFile"] == "/etc/fleet/fleet.env"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == value, key
    assert "AF_INET" in service["RestrictAddressFamilies"]
    assert "@system-service" in (DEPLOY / "systemd" / name).read_text(encoding="utf-8")
    exec_start = " ".join(service["ExecStart"].replace("\\\n", " ").split())
    expected = {
        "fleet-web@.service": "/opt/fleet/venv/bin/daphne --bind 127.0.0.1 --port %i",
        "fleet-worker.service": "/opt/fleet/venv/bin/celery --app fleet worker",
        "fleet-beat.service": "/opt/fleet/venv/bin/celery --app fleet beat",
    }[name]
    assert exec_start.startswith(expected), exec_start
    if name == "fleet-web@.service":
        assert exec_start.endswith("fleet.asgi:application")


def test_the_proxies_balance_the_same_web_instances() -> None:
    nginx = (DEPLOY / "nginx" / "fleet.conf").read_text(encoding="utf-8")
    caddy = (DEPLOY / "caddy" / "Caddyfile").read_text(encoding="utf-8")
    upstream = nginx[nginx.index("upstream fleet_web") : nginx.index("}", nginx.index("upstream"))]
    nginx_ports = re.findall(r"server 127\.0\.0\.1:(\d+)", upstream)
    caddy_ports = re.findall(
        r"127\.0\.0\.1:(\d+)", caddy[caddy.index("reverse_proxy") :].split("{")[0]
    )
    assert nginx_ports == caddy_ports and len(nginx_ports) >= 2
    assert "location /ws/" in nginx and "proxy_read_timeout 3600s" in nginx
    assert "proxy_set_header X-Forwarded-Proto $scheme" in nginx
    assert "alias /var/lib/fleet/static/" in nginx and "root * /var/lib/fleet/static" in caddy


def test_the_agents_workloads_live_in_a_delegated_cgroup_of_their_own() -> None:
    agent = unit(AGENT_UNITS / "fleet-agent.service")
    holder = unit(AGENT_UNITS / "fleet-workloads.service")
    assert agent["Service"]["KillMode"] == "process"
    assert "--cgroup-base /system.slice/fleet-workloads.service" in agent["Service"]["ExecStart"]
    assert "fleet-workloads.service" in agent["Unit"]["Wants"]
    assert "fleet-workloads.service" in agent["Unit"]["After"]
    for key in ("BindsTo", "PartOf", "Requires"):
        assert "fleet-workloads" not in agent["Unit"].get(key, ""), key
    service = holder["Service"]
    assert set(service["Delegate"].split()) >= {"memory", "pids"}
    # No process of its own in the base (cgroup v2 "no internal processes"), and the cgroup
    # stays while the unit is active.
    assert (service["Type"], service["RemainAfterExit"]) == ("oneshot", "yes")
    assert "Slice" not in service  # /system.slice/, as --cgroup-base says


@needs_tools
def test_a_server_unit_that_loses_its_hardening_fails_the_check(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, deploy)
    web = deploy / "systemd" / "fleet-web@.service"
    text = web.read_text(encoding="utf-8")
    # Every sandboxing line goes: still a valid unit, but exposed (systemd scores it 9.2).
    web.write_text(
        text[: text.index("NoNewPrivileges=yes")] + text[text.index("[Install]") :],
        encoding="utf-8",
    )
    result = run_check(deploy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "exposure is above 2.5" in result.stderr
