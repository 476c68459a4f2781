"""The agent as its own install: ``pip install ./hostagent`` in a throwaway virtual environment
gives a light ``fleet-agent`` (no Django), and the systemd unit keeps workloads across restarts."""

from __future__ import annotations

import configparser
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import hostagent

AGENT = Path(hostagent.__file__).parent
UNIT = AGENT / "packaging" / "fleet-agent.service"


def test_the_agents_own_install_lists_every_agent_package():
    listed = tomllib.loads((AGENT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = sorted(
        ".".join(("hostagent", *p.parent.relative_to(AGENT).parts))
        for p in AGENT.rglob("__init__.py")
        if "build" not in p.parts
    )
    assert sorted(listed) == found


def test_the_agents_install_needs_no_control_plane_dependency():
    project = tomllib.loads((AGENT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("<")[0].split("=")[0] for d in project["dependencies"]}
    assert names == {"nvidia-ml-py", "websockets", "msgspec", "docker"}
    assert project["scripts"] == {"fleet-agent": "hostagent.cli:main"}


def test_the_unit_keeps_workloads_across_restarts_and_its_state_private():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert service["KillMode"] == "process"  # process workloads survive an agent restart
    assert service["Restart"] == "always"
    assert (service["StateDirectory"], service["StateDirectoryMode"]) == ("fleet-agent", "0700")
    assert service["UMask"] == "0077"
    exec_start = service["ExecStart"]
    assert "--token-file /var/lib/fleet-agent/state.json" in exec_start
    assert "--state-dir /var/lib/fleet-agent/workloads" in exec_start
    assert "docker.service" in unit["Unit"]["After"]


def _index_reachable() -> bool:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    parts = urlsplit(index)
    try:
        with socket.create_connection((parts.hostname or "pypi.org", parts.port or 443), timeout=5):
            return True
    except OSError:
        return False


@pytest.mark.packaging
@pytest.mark.timeout(900)
def test_pip_install_of_the_agent_gives_a_light_fleet_agent(tmp_path):
    if not _index_reachable():
        pytest.skip("the package index cannot be reached (PIP_INDEX_URL or pypi.org)")
    source = tmp_path / "src" / "hostagent"  # a copy: the build leaves nothing in the checkout
    shutil.copytree(
        AGENT, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, agent = venv / "bin" / "python", venv / "bin" / "fleet-agent"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(source),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    version = subprocess.run([str(agent), "--version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.strip() == hostagent.__version__
    for absent in ("django", "fleet", "rest_framework", "celery"):
        probe = subprocess.run(
            [str(python), "-c", f"import {absent}"], capture_output=True, env=env, cwd=tmp_path
        )
        assert probe.returncode != 0, f"{absent} is importable from the agent's install"
    modules = sorted(
        ".".join(("hostagent", *p.relative_to(AGENT).with_suffix("").parts))
        for p in AGENT.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "build" not in p.parts
    )
    imports = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]",
            *modules,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert imports.returncode == 0, imports.stderr[-3000:]
