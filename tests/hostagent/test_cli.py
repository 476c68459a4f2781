from __future__ import annotations

import json
import os
import stat

import pytest

from hostagent import cli
from hostagent.config import AgentConfig, AgentState, ConfigError, load_specs, write_state
from tests.hostagent import specs


def test_once_json_prints_discovery_and_one_sample_from_a_simulation(tmp_path, capsys):
    spec_file = tmp_path / "gpus.json"
    spec_file.write_text(json.dumps({"seed": 4, "gpus": [specs.h100(), specs.l4()]}))
    assert cli.main(["--simulate", str(spec_file), "--once", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["name"] for g in out["hello"]["gpus"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
    assert out["hello"]["backend"] == "simulated"
    assert len(out["telemetry"]["gpus"]) == 2


def test_missing_token_is_a_clear_error(tmp_path, capsys):
    code = cli.main(["--server", "http://x", "--token-file", str(tmp_path / "none.json")])
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
    with pytest.raises(ConfigError, match="missing key"):
        load_specs(bad)
