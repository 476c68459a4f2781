"""Start systemd units' processes without systemd (CI has no systemd as PID 1): what their
``ExecStart=`` lines say, with their ``Environment=``, ``EnvironmentFile=``,
``WorkingDirectory=`` and ``User=``/``Group=``, the specifiers ``%i``, ``%N``, ``%H`` and ``%%``,
and their ``StateDirectory=`` made under the state root the unit names. Enough for Fleet's units
(``deploy/systemd``, ``hostagent/packaging``), not a systemd: no sandboxing, no restarts.

    python tests/deploy/unit_runner.py [--state-root DIR] UNIT_DIR LOG_DIR \
        fleet-web@8001.service fleet-worker.service ...

runs them until SIGTERM or SIGINT, then stops them with their ``KillSignal=``."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


@dataclasses.dataclass
class Unit:
    name: str
    exec_start: list[list[str]]
    environment: dict[str, str]
    working_directory: str | None
    user: str | None
    kill_signal: int
    oneshot: bool


def read_unit(path: Path) -> dict[str, list[str]]:
    """The ``[Service]`` section's keys, each with its values in order (continuations joined)."""
    keys: dict[str, list[str]] = {}
    section = ""
    logical = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = logical + raw.strip()
        if line.endswith("\\"):
            logical = line[:-1] + " "
            continue
        logical = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def environment_file(path: str) -> dict[str, str]:
    optional = path.startswith("-")
    try:
        text = Path(path.lstrip("-")).read_text(encoding="utf-8")
    except FileNotFoundError:
        if optional:
            return {}
        raise
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip('"')
    return values


def load(unit_dir: Path, name: str, state_root: Path = Path("/var/lib")) -> Unit:
    """``name`` may be a template's instance: fleet-web@8001.service reads fleet-web@.service.
    ``StateDirectory=`` is made under ``state_root`` (where install.sh --state-root put the
    units' /var/lib)."""
    stem, _, instance = name.removesuffix(".service").partition("@")
    path = unit_dir / (f"{stem}@.service" if instance else name)
    keys = read_unit(path)

    def expand(text: str) -> str:
        return (
            text.replace("%%", "\0")
            .replace("%i", instance)
            .replace("%N", name.removesuffix(".service"))
            .replace("%H", socket.gethostname())
            .replace("\0", "%")
        )

    env: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    for item in keys.get("EnvironmentFile", []):
        env.update(environment_file(expand(item)))
    for item in keys.get("Environment", []):
        for assignment in shlex.split(expand(item)):
            key, value = assignment.split("=", 1)
            env[key] = value
    user = keys.get("User", [None])[-1]
    if user is not None:
        env["HOME"] = pwd.getpwnam(user).pw_dir
    commands = [shlex.split(expand(line).lstrip("-@:+!")) for line in keys.get("ExecStart", [])]
    for state in keys.get("StateDirectory", []):
        directory = state_root / state
        directory.mkdir(parents=True, exist_ok=True)
        mode = keys.get("StateDirectoryMode", ["0755"])[-1]
        directory.chmod(int(mode, 8))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
    kill = keys.get("KillSignal", ["SIGTERM"])[-1]
    return Unit(
        name=name,
        exec_start=commands,
        environment=env,
        working_directory=keys.get("WorkingDirectory", [None])[-1],
        user=user,
        kill_signal=int(getattr(signal, kill if kill.startswith("SIG") else f"SIG{kill}")),
        oneshot=keys.get("Type", ["simple"])[-1] == "oneshot",
    )


def start(unit: Unit, log_dir: Path) -> list[subprocess.Popen[bytes]]:
    """Start the unit's command(s): a oneshot's run one after another to the end; a service's
    one process is returned running."""
    log = (log_dir / f"{unit.name}.log").open("ab")
    prefix: list[str] = []
    if unit.user is not None and unit.user != pwd.getpwuid(os.getuid()).pw_name:
        prefix = ["setpriv", f"--reuid={unit.user}", f"--regid={unit.user}", "--init-groups"]
    started = []
    for command in unit.exec_start:
        process = subprocess.Popen(
            [*prefix, *command],
            cwd=unit.working_directory,
            env=unit.environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if unit.oneshot:
            if process.wait() != 0:
                raise SystemExit(f"{unit.name}: {command[0]} exited {process.returncode}")
        else:
            started.append(process)
    return started


def main(argv: list[str]) -> int:
    state_root = Path("/var/lib")
    if argv[:1] == ["--state-root"]:
        state_root, argv = Path(argv[1]), argv[2:]
    unit_dir, log_dir, names = Path(argv[0]), Path(argv[1]), argv[2:]
    log_dir.mkdir(parents=True, exist_ok=True)
    running: list[tuple[Unit, subprocess.Popen[bytes]]] = []
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for name in names:
        unit = load(unit_dir, name, state_root)
        running += [(unit, process) for process in start(unit, log_dir)]
        print(f"started {name}", flush=True)
    print("ready", flush=True)
    while not stop:
        for unit, process in running:
            if process.poll() is not None:
                print(f"{unit.name} exited {process.returncode}", flush=True)
                stop = True
        time.sleep(0.2)
    for unit, process in running:
        if process.poll() is None:
            os.killpg(process.pid, unit.kill_signal)
    deadline = time.monotonic() + 30
    for _, process in running:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
