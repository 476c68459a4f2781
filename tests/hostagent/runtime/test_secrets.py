"""Team secrets on the agent: their values (the env names in ``secret_env``) stay in memory,
never in the state directory; a replica read back from the store without them waits for the
control plane; their values are masked in the replica's logs; a new value restarts nothing."""

from __future__ import annotations

import dataclasses

import pytest

from hostagent.gpu.simulated import SimulatedBackend
from hostagent.protocol import LogsRequest
from hostagent.runtime import Supervisor, Timing, WorkloadSync
from hostagent.runtime.output import Output, mask_secrets
from hostagent.runtime.store import ReplicaStore, Stored
from tests.hostagent.runtime.fakes import FakeRuntime, spec, wait_for

FAST = Timing.scaled(0.01, poll_s=0.01)
TOKEN = "hf_SECRET_token_123"


def secret_spec(allocation_id: int, token: str = TOKEN):
    plain = spec(allocation_id, env={"HF_TOKEN": token, "MODE": "fast"})
    return dataclasses.replace(plain, secret_env=("HF_TOKEN",))


@pytest.fixture
def runtime():
    return FakeRuntime()


@pytest.fixture
def supervisor(runtime, tmp_path):
    made = []

    def make() -> Supervisor:
        s = Supervisor(
            {"process": runtime}, agent_runtime="process", state_dir=tmp_path, timing=FAST
        )
        s.start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _files_text(directory) -> str:
    return "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in directory.rglob("*") if p.is_file()
    )


def test_the_store_keeps_the_names_of_secrets_but_never_their_values(tmp_path):
    store = ReplicaStore(tmp_path)
    given = secret_spec(1)

    store.save([Stored(given, restarts=2)])

    assert TOKEN not in _files_text(tmp_path)
    loaded = store.load()[1].spec
    assert loaded.secret_env == ("HF_TOKEN",)
    assert loaded.workload["env"] == {"MODE": "fast"}
    assert loaded.secrets_missing() and not given.secrets_missing()
    # Read back, it is the replica that was launched: an adopted workload is not restarted.
    assert loaded.fingerprint() == given.fingerprint()


def test_a_supervisor_never_writes_a_secret_to_its_state_directory(supervisor, runtime, tmp_path):
    s = supervisor()
    s.place("GPU-1", [secret_spec(1)])
    wait_for(lambda: s.states().get(1) == "running")

    assert (tmp_path / "replicas.json").exists()
    assert TOKEN not in _files_text(tmp_path)


def test_a_replica_read_back_without_its_secret_waits_for_the_control_plane(
    supervisor, runtime, tmp_path
):
    ReplicaStore(tmp_path).save([Stored(secret_spec(1), restarts=0)])
    s = supervisor()
    s.authorize(["GPU-2"])  # a desired state that does not speak of GPU-1: no new spec for it

    with pytest.raises(AssertionError):
        wait_for(lambda: runtime.starts, timeout_s=0.3)

    s.place("GPU-1", [secret_spec(1)])  # the control plane sends it again, value included
    wait_for(lambda: runtime.starts == [1])


def test_a_new_secret_value_restarts_nothing_by_itself(supervisor, runtime):
    s = supervisor()
    s.place("GPU-1", [secret_spec(1)])
    wait_for(lambda: s.states().get(1) == "running")

    s.place("GPU-1", [secret_spec(1, token="hf_ROTATED_token_456")])

    with pytest.raises(AssertionError):
        wait_for(lambda: runtime.stops, timeout_s=0.3)
    assert runtime.starts == [1]


def test_secret_values_of_four_characters_or_more_are_masked_in_the_logs(supervisor, runtime):
    s = supervisor()
    short = dataclasses.replace(
        spec(2, env={"HF_TOKEN": TOKEN, "PIN": "123", "CERT": "line-one\nline-two"}),
        secret_env=("HF_TOKEN", "PIN", "CERT"),
    )
    s.place("GPU-1", [short])
    wait_for(lambda: s.states().get(2) == "running")
    runtime.output[2] = [f"token={TOKEN} pin=123", "cert: line-one", "done"]
    request: LogsRequest = {
        "type": "logs_request",
        "request_id": "r1",
        "allocation_id": 2,
        "tail": 10,
    }

    answer = WorkloadSync(s, SimulatedBackend([]), gpu_request=False).logs(request)

    assert answer["lines"] == ["token=*** pin=123", "cert: ***", "done"]


def test_masking_replaces_the_longest_value_first():
    output = Output(["a=abcdefgh b=abcd"], truncated=True)

    masked = mask_secrets(output, ["abcd", "abcdefgh", "xyz"])

    assert masked == Output(["a=*** b=***"], truncated=True)
