from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from hostagent import cli, daemon
from hostagent.config import AgentConfig, AgentState, ConfigError, load_specs, write_state
from hostagent.gpu.backend import BackendError
from hostagent.mps import MpsManager
from tests.hostagent import specs
from tests.hostagent.faulty import FaultyBackend, Nvml999


def test_once_json_prints_discovery_and_one_sample_from_a_simulation(tmp_path, capsys):
    spec_file = tmp_path / "gpus.json"
    spec_file.write_text(json.dumps({"seed": 4, "gpus": [specs.h100(), specs.l4()]}))
    assert cli.main(["--simulate", str(spec_file), "--once", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["name"] for g in out["hello"]["gpus"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
    assert out["hello"]["backend"] == "simulated"
    assert len(out["telemetry"]["gpus"]) == 2


def test_missing_token_is_a_clear_error(tmp_path, capsys):
    code = cli.main(["--server", "http://127.0.0.1:9", "--token-file", str(tmp_path / "none.json")])
    assert code == 2
    assert "no token" in capsys.readouterr().err


def test_flags_override_the_environment():
    base = AgentConfig.from_env(
        {
            "FLEET_AGENT_SERVER": "http://env",
            "FLEET_AGENT_INTERVAL": "5",
            "FLEET_AGENT_ALLOW_MUTATION": "1",
        }
    )
    assert base.allow_mutation and base.interval_s == 5
    args = cli.parser().parse_args(["--server", "http://flag", "--interval", "0.5"])
    config = cli.config_from_args(args, base)
    assert (config.server, config.interval_s, config.allow_mutation) == ("http://flag", 0.5, True)


def test_the_state_file_is_private(tmp_path):
    path = tmp_path / "sub" / "state.json"
    write_state(path, AgentState(token="secret", host_id="7"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_malformed_spec_file_is_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x"}]))
    with pytest.raises(ConfigError, match="missing required field"):
        load_specs(bad)


def test_once_survives_a_driver_that_fails_to_initialise(tmp_path, capsys, monkeypatch):
    sim = FaultyBackend([specs.l4()])
    # At start, then again when the collector retries: both kinds of mismatch (review §1).
    sim.fail("init", BackendError("Driver/library version mismatch"), Nvml999("mismatch"))
    monkeypatch.setattr(cli, "build_backend", lambda config: (sim, MpsManager(sim.mps_control)))
    spec_file = tmp_path / "gpus.json"
    spec_file.write_text(json.dumps({"gpus": [specs.l4()]}))
    assert cli.main(["--simulate", str(spec_file), "--once", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hello"]["gpus"] == [] and out["telemetry"]["gpus"] == []


def test_an_unexpected_error_ends_main_with_a_message_and_status_1(capsys, monkeypatch):
    async def broken(config):
        raise Nvml999("NVMLLibraryMismatchError")

    monkeypatch.setattr(cli, "run_agent", broken)
    assert cli.main(["--server", "http://x", "--token", "t"]) == 1
    assert "unexpected error: NVMLLibraryMismatchError" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "warned"),
    [("470.82.01", True), ("520.61.05", True), ("535.183.01", False), ("580.65.06", False)],
)
def test_a_driver_older_than_r525_is_warned_about_at_start(version, warned, caplog):
    sim = FaultyBackend([specs.a100()], driver_version=version)
    sim.init()
    with caplog.at_level(logging.WARNING, logger="hostagent.daemon"):
        daemon.check_host(sim)
    assert any("older than R525" in r.getMessage() for r in caplog.records) is warned


class RealDriver(FaultyBackend):
    kind = "nvml"


@pytest.mark.parametrize(("euid", "warned"), [(1000, True), (0, False)])
def test_running_the_nvml_backend_without_root_is_warned_about(euid, warned, caplog, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    with caplog.at_level(logging.WARNING, logger="hostagent.daemon"):
        daemon.check_host(RealDriver([specs.a100()]))
        daemon.check_host(FaultyBackend([specs.a100()]))  # simulated: nothing to warn about
    assert [r.getMessage().startswith("not running as root") for r in caplog.records] == (
        [True] if warned else []
    )


def test_the_runtime_comes_from_the_environment_or_the_flag(tmp_path):
    base = AgentConfig.from_env(
        {"FLEET_AGENT_RUNTIME": "process", "FLEET_AGENT_TOKEN_FILE": str(tmp_path / "s.json")}
    )
    assert base.runtime == "process" and base.workload_dir == tmp_path / "workloads"
    args = cli.parser().parse_args(["--runtime", "none", "--state-dir", str(tmp_path / "w")])
    config = cli.config_from_args(args, base)
    assert (config.runtime, config.workload_dir) == ("none", tmp_path / "w")
    with pytest.raises(ConfigError, match="docker, process or none"):
        AgentConfig.from_env({"FLEET_AGENT_RUNTIME": "podman"})


def test_an_agent_that_may_not_change_its_host_runs_no_workloads():
    assert daemon.resolve_runtime(AgentConfig()) == "none"
    with pytest.raises(ConfigError, match="needs --allow-mutation"):
        daemon.resolve_runtime(AgentConfig(runtime="process"))
    allowed = AgentConfig(allow_mutation=True, runtime="process")
    assert daemon.resolve_runtime(allowed) == "process"


def test_the_default_runtime_is_docker_when_its_daemon_answers(monkeypatch):
    from hostagent import runtime

    monkeypatch.setattr(runtime, "docker_answers", lambda: True)
    assert daemon.resolve_runtime(AgentConfig(allow_mutation=True)) == "docker"
    monkeypatch.setattr(runtime, "docker_answers", lambda: False)
    assert daemon.resolve_runtime(AgentConfig(allow_mutation=True)) == "process"


def test_once_reports_the_runtime_in_hello(tmp_path, capsys):
    spec_file = tmp_path / "gpus.json"
    spec_file.write_text(json.dumps({"gpus": [specs.l4()]}))
    assert cli.main(["--simulate", str(spec_file), "--once", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hello"]["runtime"] == "none"


def test_a_restarted_service_keeps_its_host_token_instead_of_enrolling_again(tmp_path):
    token_file = tmp_path / "state.json"
    write_state(token_file, AgentState(token="host-token", host_id="3", applied_generation=4))
    config = AgentConfig(
        server="http://127.0.0.1:9",  # nothing answers: enrolling again would fail
        enrollment_token="fle_already_used",
        token_file=token_file,
    )
    assert daemon.resolve_state(config) == AgentState("host-token", "3", 4)


def test_the_port_flags_default_to_the_range_the_bridge_and_loopback():
    config = cli.config_from_args(cli.parser().parse_args([]), AgentConfig(hostname="gpu-7"))
    assert (config.port_range, config.container_network) == ("20000-29999", "fleet")
    assert config.publish_address == "127.0.0.1" == config.reported_address
    wildcard = cli.parser().parse_args(["--publish-address", "0.0.0.0"])
    assert cli.config_from_args(wildcard, AgentConfig(hostname="gpu-7")).reported_address == "gpu-7"
    named = cli.parser().parse_args(["--port-range", "30000-30099", "--address", "10.0.0.7"])
    config = cli.config_from_args(named, AgentConfig(hostname="gpu-7"))
    assert (config.port_range, config.reported_address) == ("30000-30099", "10.0.0.7")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port-range", "80-90"], "--port-range"),
        (["--port-range", "2-1"], "--port-range"),
        (["--publish-address", "example.com"], "--publish-address must be an IP"),
        (["--container-network", "bad name"], "--container-network"),
        (["--address", "a b"], "--address must be"),
    ],
)
def test_a_malformed_port_flag_is_a_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        cli.config_from_args(cli.parser().parse_args(flags), AgentConfig())


def test_hello_carries_the_hosts_address_when_given():
    from hostagent.collector import Collector
    from hostagent.gpu.simulated import SimulatedBackend

    sim = SimulatedBackend([specs.a30()], seed=1)
    sim.init()
    hello = Collector(sim, hostname="h", address="10.0.0.7").hello(applied_generation=0)
    assert hello["address"] == "10.0.0.7"
    assert "address" not in Collector(sim, hostname="h").hello(applied_generation=0)


def test_a_hostname_hello_cannot_carry_is_not_reported_as_the_address():
    wildcard = cli.parser().parse_args(["--publish-address", "0.0.0.0"])
    config = cli.config_from_args(wildcard, AgentConfig(hostname="gpu 7/weird"))
    assert config.reported_address == ""
    underscored = cli.config_from_args(wildcard, AgentConfig(hostname="gpu_7"))
    assert underscored.reported_address == "gpu_7"
