"""Which processes belong to which replica: by session for process groups, by PID namespace for
containers (what the GPU page shows as *replica 3 of qwen-7b*)."""

from __future__ import annotations

import os

from hostagent.runtime import ProcessRuntime
from hostagent.runtime.docker import DockerRuntime
from hostagent.runtime.procfs import Leaders, all_pids, members, owners, read_stat
from tests.hostagent.runtime.fakes import spec, wait_for
from tests.hostagent.runtime.test_docker import container_spec


def test_a_process_groups_children_and_a_containers_processes_are_named_by_replica(
    tmp_path, kill_sessions, docker_host
):
    processes = ProcessRuntime(tmp_path, as_agent_user=True)
    group = processes.start(spec(3, command=["sh", "-c", "sleep 30 & sleep 30 & wait"]))
    kill_sessions.append(group.pid)
    containers = DockerRuntime(docker_host, image_pull="if-not-present")
    try:
        box = containers.start(
            container_spec(4, command=["sh", "-c", "sleep 30 & sleep 30 & wait"])
        )
        leaders = Leaders(sessions={group.pid: 3}, containers={box.pid: 4})
        found = wait_for(
            lambda: (
                (m := members(leaders)) and len(m.get(3, [])) == 3 and len(m.get(4, [])) == 3 and m
            )
        )
        assert group.pid in found[3] and box.pid in found[4]
        assert all(read_stat(pid).session == group.pid for pid in found[3])
        others = [p for p in all_pids() if p not in found[3] + found[4]]
        assert owners(others, leaders) == {}  # the agent itself, this test: nobody's replica
        assert os.getpid() in others
    finally:
        containers.close()


def test_nothing_is_claimed_without_workloads():
    assert owners(all_pids(), Leaders({}, {})) == {}
