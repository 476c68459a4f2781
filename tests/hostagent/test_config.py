"""The agent's confinement settings (review H1/H3): process workloads off unless allowed and
said in the hello, the image pull policy, and the agent's own files kept private."""

from __future__ import annotations

import os
import stat

import pytest

from hostagent import cli, daemon, protocol
from hostagent.collector import Collector
from hostagent.config import AgentConfig, ConfigError, ensure_private
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.runtime import PROCESS_RUNTIME_OFF
from tests.hostagent import specs


def test_process_workloads_are_off_and_images_always_pulled_by_default():
    config = AgentConfig.from_env({})
    assert not config.allow_process_runtime and not config.process_as_agent_user
    assert config.image_pull == "always" and config.cgroup_base is None


def test_the_environment_and_the_flags_turn_them_on():
    env = {
        "FLEET_AGENT_ALLOW_PROCESS_RUNTIME": "1",
        "FLEET_AGENT_IMAGE_PULL": "if-not-present",
        "FLEET_AGENT_CGROUP_BASE": "/fleet.slice",
    }
    config = AgentConfig.from_env(env)
    assert config.allow_process_runtime and config.image_pull == "if-not-present"
    assert config.cgroup_base == "/fleet.slice"
    args = cli.parser().parse_args(
        ["--allow-process-runtime", "--process-as-agent-user", "--image-pull", "always"]
    )
    flagged = cli.config_from_args(args, config)
    assert flagged.process_as_agent_user and flagged.image_pull == "always"
    with pytest.raises(ConfigError, match="IMAGE_PULL"):
        AgentConfig.from_env({"FLEET_AGENT_IMAGE_PULL": "never"})


def test_the_hello_says_whether_the_agent_runs_process_workloads():
    sim = SimulatedBackend([specs.a30()], seed=1)
    sim.init()
    for allowed, runtime, said in [
        (True, "process", True),
        (False, "docker", False),
        (True, "none", False),
    ]:
        hello = Collector(sim, hostname="h1", runtime=runtime, process_runtime=allowed).hello(
            applied_generation=0
        )
        protocol.validate(hello, protocol.Hello)
        assert hello["process_runtime"] is said


def test_an_agent_without_the_flag_builds_a_process_runtime_that_refuses(tmp_path):
    base = AgentConfig(allow_mutation=True, state_dir=tmp_path / "w", runtime="process")
    sim = SimulatedBackend([specs.a30()], seed=1)
    off = daemon.build_workloads(base, sim, "process")
    assert off.supervisor.runtimes["process"].refusal == PROCESS_RUNTIME_OFF
    on = daemon.build_workloads(
        AgentConfig(
            allow_mutation=True,
            state_dir=tmp_path / "w2",
            runtime="process",
            allow_process_runtime=True,
            cgroup_base="/no-such-fleet-cgroup",
        ),
        sim,
        "process",
    )
    assert on.supervisor.runtimes["process"].refusal is None


def test_loose_modes_of_the_token_file_and_state_directory_are_tightened(tmp_path):
    token, state = tmp_path / "state.json", tmp_path / "workloads"
    token.write_text("{}")
    state.mkdir()
    os.chmod(token, 0o644)
    os.chmod(state, 0o755)
    ensure_private(token, 0o600)
    ensure_private(state, 0o700)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    ensure_private(tmp_path / "missing", 0o600)  # made later, private from the start


def test_a_token_file_of_another_user_stops_the_agent(tmp_path, monkeypatch):
    token = tmp_path / "state.json"
    token.write_text("{}")
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(token).st_uid + 1)
    with pytest.raises(ConfigError, match="must be the agent's own"):
        ensure_private(token, 0o600)
