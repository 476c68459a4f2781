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


def test_established_counts_the_connections_accepted_on_the_ports_in_the_pids_namespace():
    import socket

    from hostagent.runtime.procfs import established

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        assert established(os.getpid(), [port]) == 0
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        # One accepted on the port (the client's own end has an ephemeral local port).
        assert established(os.getpid(), [port]) == 1
        client.close()
        accepted.close()
        assert wait_for(lambda: established(os.getpid(), [port]) == 0)
    finally:
        server.close()


def test_established_is_not_known_for_a_process_that_cannot_be_read(tmp_path):
    from hostagent.runtime.procfs import established

    assert established(424242, [80], proc=tmp_path) is None
    tables = tmp_path / "7" / "net"
    tables.mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue\n"
    (tables / "tcp").write_text(
        header
        + "   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000\n"  # :8080, established
        + "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n"  # :8080, listening
        + "   2: 0100007F:1F91 0100007F:D432 01 00000000:00000000\n"  # :8081
        + "   3: garbage\n"
        + "   4: 0100007F:ZZZZ 0100007F:D432 01 00000000:00000000\n",
        encoding="ascii",
    )
    assert established(7, [8080], proc=tmp_path) == 1
    assert established(7, [8080, 8081], proc=tmp_path) == 2
    assert established(7, [9000], proc=tmp_path) == 0
