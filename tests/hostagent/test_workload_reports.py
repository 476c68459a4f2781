"""The agent reports its workloads to the control plane: ``hello.runtime``, a full report after
each hello, changes as they happen, the authoritative desired state it fetches itself after a
restart, and the same over the REST fallback."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import threading
import time
from http import HTTPStatus
from pathlib import Path

from websockets.asyncio.server import serve

from hostagent import protocol
from hostagent.client import AgentClient
from hostagent.collector import Collector
from hostagent.config import AgentState
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from hostagent.runtime import ProcessRuntime, Supervisor, Timing, WorkloadSync
from tests.hostagent import specs
from tests.hostagent.runtime.fakes import spec as replica_spec
from tests.hostagent.runtime.fakes import workload
from tests.hostagent.runtime.kit import allocation, desired

LOOP = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"]


def make_agent(tmp_path, server="http://127.0.0.1:9"):
    sim = SimulatedBackend([specs.a30()], seed=3)
    sim.init()
    mps = MpsManager(sim.mps_control, tmp_path / "mps")
    runtime = ProcessRuntime(tmp_path / "workloads", as_agent_user=True)
    supervisor = Supervisor(
        {"process": runtime},
        agent_runtime="process",
        state_dir=tmp_path / "workloads",
        timing=Timing.scaled(0.01, poll_s=0.05),
    )
    supervisor.start()
    sync = WorkloadSync(supervisor, sim, gpu_request=False)
    collector = Collector(
        sim, hostname="h1", mps=mps, allow_mutation=True, runtime="process", owners=sync.owners
    )
    client = AgentClient(
        server=server,
        state=AgentState(token="tok"),
        backend=sim,
        collector=collector,
        mps=mps,
        allow_mutation=True,
        interval_s=0.05,
        seed=1,
        workloads=sync,
    )
    return client, sim, supervisor


def states_in(messages, allocation_id):
    return [
        w["state"]
        for m in messages
        if m["type"] == "workloads"
        for w in m["workloads"]
        if w["allocation_id"] == allocation_id
    ]


def test_over_the_socket_the_agent_reports_its_runtime_and_every_change(tmp_path):
    client, sim, supervisor = make_agent(tmp_path)
    gpu = sim.list_gpus()[0].uuid
    seen: list[dict] = []
    done = asyncio.Event()

    async def handler(ws):
        hello = protocol.decode(await ws.recv())
        assert hello["runtime"] == "process"
        await ws.send(protocol.encode(desired(gpu, 1, [allocation(7, workload(command=LOOP))])))
        async for text in ws:
            message = protocol.decode(text)  # every message is valid protocol
            seen.append(message)
            if "running" in states_in([message], 7):
                await ws.send(protocol.encode(desired(gpu, 2, [])))
            acked = [m["generation"] for m in seen if m["type"] == "ack"]
            if "none" in states_in(seen, 7) and 2 in acked:
                done.set()

    async def scenario():
        async with serve(handler, "127.0.0.1", 0) as server:
            client.server = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            stop = asyncio.Event()
            task = asyncio.create_task(client.run(stop))
            await asyncio.wait_for(done.wait(), 10)
            stop.set()
            await asyncio.wait_for(task, 5)

    try:
        asyncio.run(scenario())
    finally:
        supervisor.close()
    reports = [m for m in seen if m["type"] == "workloads"]
    assert reports[0]["full"] and {w["allocation_id"] for w in reports[0]["workloads"]} <= {7}
    # The full report may already say running (the process started before it was sent);
    # pending and starting may pass between two reports.
    states = states_in(reports, 7)
    assert "running" in states
    assert states.index("running") < states.index("none") and states[-1] == "none"
    assert all(not m["full"] for m in reports[1:])
    assert [m["generation"] for m in seen if m["type"] == "ack"] == [1, 2]


def test_a_restarted_agent_fetches_the_desired_state_to_learn_what_it_may_stop(tmp_path):
    sim = SimulatedBackend([specs.a30()], seed=3)  # the same GPU as the agent's
    sim.init()
    gpu = sim.list_gpus()[0].uuid
    # What the agent before this one started.
    earlier = ProcessRuntime(tmp_path / "workloads", as_agent_user=True)
    orphan = earlier.start(replica_spec(9, gpu, command=LOOP))
    # A process forked a moment ago may not run its command yet (a loaded machine): the new
    # agent would not recognise it as a workload. A restarted agent finds settled ones.
    deadline = time.monotonic() + 5
    cmdline = Path(f"/proc/{orphan.pid}/cmdline")
    while time.monotonic() < deadline and b"while" not in cmdline.read_bytes():
        time.sleep(0.01)
    client, sim, supervisor = make_agent(tmp_path)
    seen: list[dict] = []
    done = asyncio.Event()

    def process_request(connection, request):
        if request.path == protocol.DESIRED_STATE_PATH:
            return connection.respond(HTTPStatus.OK, protocol.encode(desired(gpu, 0, [])))
        return None

    async def handler(ws):  # never pushes: the agent's generation is not behind
        async for text in ws:
            message = protocol.decode(text)
            seen.append(message)
            if message["type"] == "event" and message["kind"] == "orphan_stopped":
                done.set()

    async def scenario():
        async with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
            client.server = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            stop = asyncio.Event()
            task = asyncio.create_task(client.run(stop))
            await asyncio.wait_for(done.wait(), 10)
            await asyncio.sleep(0.2)
            stop.set()
            await asyncio.wait_for(task, 5)

    try:
        asyncio.run(scenario())
    finally:
        supervisor.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(orphan.pid, signal.SIGKILL)
    # The orphan was stopped (the orphan_stopped event ended the scenario). The first, full
    # report lists it running, unless the stop had already ended it when that report was sent
    # (a loaded machine): then it is not reported at all.
    full = next(m for m in seen if m["type"] == "workloads")
    reported = [(w["allocation_id"], w["state"]) for w in full["workloads"]]
    assert full["full"] and reported in ([(9, "running")], [(9, "stopping")], []), reported
    assert [m["generation"] for m in seen if m["type"] == "ack"] == [0]
    states = states_in(seen, 9)
    assert not states or states[-1] == "none"


def test_the_rest_transport_carries_the_full_report_after_hello_and_the_changes(tmp_path):
    batches: list[list[dict]] = []
    wanted: dict = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            batches.append([protocol.validate_message(m) for m in body["messages"]])
            self._answer(200, {"accepted": len(batches[-1])})

        def do_GET(self):
            self._answer(200, wanted["desired"])

        def _answer(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client, sim, supervisor = make_agent(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    gpu = sim.list_gpus()[0].uuid
    wanted["desired"] = desired(gpu, 1, [allocation(7, workload(command=LOOP))])

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(client.run_rest(stop))
        while "running" not in states_in([m for b in batches for m in b], 7):
            await asyncio.sleep(0.05)
        wanted["desired"] = desired(gpu, 2, [])
        while "none" not in states_in([m for b in batches for m in b], 7):
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 5)

    try:
        asyncio.run(asyncio.wait_for(scenario(), 15))
    finally:
        supervisor.close()
        server.shutdown()
    sent = [m for b in batches for m in b]
    assert sent[0]["type"] == "hello" and sent[0]["runtime"] == "process"
    reports = [m for m in sent if m["type"] == "workloads"]
    assert reports[0]["full"]  # in the first batch, or the next once adoption is done
    later = [m for b in batches[1:] for m in b]
    assert {m["generation"] for m in later if m["type"] == "ack"} >= {1, 2}
    assert states_in(later, 7)[-1] == "none"


def test_the_full_report_waits_until_the_workloads_already_here_are_found(tmp_path):
    from hostagent.runtime import Found, Running
    from hostagent.workload_reports import WorkloadChannel
    from tests.hostagent.runtime.fakes import FakeRuntime, wait_for

    runtime, may_look = FakeRuntime(), threading.Event()
    adopted = Running(5, "process", "w5", 1.0, None, "GPU-1", "qwen-7b", 30)
    runtime.live[adopted.ident] = adopted
    runtime.found = [Found(adopted, None)]
    slow_find = runtime.find
    runtime.find = lambda: may_look.wait(5) and slow_find()
    supervisor = Supervisor(
        {"process": runtime}, agent_runtime="process", timing=Timing.scaled(0.01)
    )
    supervisor.start()
    channel = WorkloadChannel(WorkloadSync(supervisor, SimulatedBackend([]), gpu_request=False))
    try:
        assert channel.after_hello() == []  # a full report now would say 5 is gone
        may_look.set()
        [full] = wait_for(channel.pending)
        assert full["full"] and [w["allocation_id"] for w in full["workloads"]] == [5]
        assert channel.pending() == []
    finally:
        supervisor.close()


def test_a_refused_report_is_sent_again_in_full_and_a_full_one_goes_every_minute(tmp_path):
    from hostagent import workload_reports
    from hostagent.runtime import Found, Running
    from hostagent.workload_reports import WorkloadChannel
    from tests.hostagent.runtime.fakes import FakeRuntime, wait_for

    clock = [1000.0]  # the channel's own clock; the supervisor and wait_for keep real time
    runtime = FakeRuntime()
    running = Running(9, "process", "w9", 1.0, None, "GPU-1", "qwen-7b", 30)
    runtime.live[running.ident] = running
    runtime.found = [Found(running, None)]
    supervisor = Supervisor(
        {"process": runtime}, agent_runtime="process", timing=Timing.scaled(0.01)
    )
    supervisor.start()
    channel = WorkloadChannel(
        WorkloadSync(supervisor, SimulatedBackend([]), gpu_request=False),
        clock=lambda: clock[0],
    )
    try:
        # The first full report: at once if adoption is already done, else once it is (change
        # reports may come before it, while adoption runs).
        seen = list(channel.after_hello())

        def full_report():
            seen.extend(channel.pending())
            return [m for m in seen if m.get("full")]

        [first] = full_report() or wait_for(full_report)
        assert [w["allocation_id"] for w in first["workloads"]] == [9]
        assert channel.pending() == []
        # The server refused one of our reports: nothing for a second, then everything again.
        channel.refused()
        assert channel.pending() == []
        clock[0] += workload_reports.RETRY_AFTER_S
        [again] = channel.pending()
        assert again["full"] and [w["allocation_id"] for w in again["workloads"]] == [9]
        # Nothing changes for a minute: a full report goes anyway (anti-entropy).
        assert channel.pending() == []
        clock[0] += workload_reports.FULL_EVERY_S
        [periodic] = channel.pending()
        assert periodic["full"]
    finally:
        supervisor.close()
