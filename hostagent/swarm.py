"""Many simulated agents in one process (one WebSocket each), for scale tests and demos."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from hostagent.client import AgentClient
from hostagent.collector import Collector
from hostagent.config import AgentState
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager
from hostagent.protocol import AgentRuntime, SimulatedGpuSpec, UpMessage
from hostagent.runtime import Supervisor, WorkloadSync, build_runtimes
from hostagent.runtime.ports import (
    DEFAULT_PORT_RANGE,
    DEFAULT_PUBLISH_ADDRESS,
    PortAllocator,
    PortRange,
    bindable,
)

logger = logging.getLogger(__name__)


class RecordingAgentClient(AgentClient):
    """An agent that remembers the ``ts`` of every telemetry message it sent (load tests compare
    them with what browsers receive)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sent_ts: list[float] = []

    async def _gather(self, tick: int) -> list[UpMessage]:
        messages = await super()._gather(tick)
        self.sent_ts.extend(float(m["ts"]) for m in messages if m["type"] == "telemetry")
        return messages


def swarm_stats(clients: Sequence[AgentClient]) -> dict[str, object]:
    """Per host token: connections made (and when each opened), how many closed with each close
    code, and the ``ts`` of each telemetry message sent."""
    return {
        "hosts": [
            {
                "token": c.state.token,
                "connections": c.connections,
                "connected_at": list(c.connected_at),
                "closes": {str(code): n for code, n in c.closes.items()},
                "sent_ts": list(getattr(c, "sent_ts", [])),
            }
            for c in clients
        ]
    }


def build_clients(
    server: str,
    hosts: Sequence[tuple[str, list[SimulatedGpuSpec]]],
    *,
    interval_s: float = 1.0,
    allow_mutation: bool = True,
    hostname_prefix: str = "sim",
    mps_dir: Path = Path("/tmp/fleet-mps-swarm"),
    record: bool = False,
    runtime: AgentRuntime = "none",
    state_dir: Path = Path("/tmp/fleet-swarm-workloads"),
    allow_process: bool = False,
    process_as_agent_user: bool = False,
    address: str | None = None,
) -> list[AgentClient]:
    """One client per ``(host token, GPU specs)``; host ``i`` uses seed ``i``.

    ``record``: :class:`RecordingAgentClient` (remembers what it sent) instead of the plain one.
    ``runtime``: what the simulated agents run their replicas' workloads with (each under
    ``state_dir/<i>``, its containers labelled with its hostname); ``none`` (the default) keeps
    them reservation-only, as the benchmarks measure them. ``allow_process`` and
    ``process_as_agent_user``: the agent's ``--allow-process-runtime`` and
    ``--process-as-agent-user`` (no cgroups: the agents share this one process). ``address``:
    what each agent's hello says it is reached at (the agent's ``--address``; the swarm's
    replicas listen on this machine, so ``127.0.0.1`` for a load balancer on it too).
    """
    clients = []
    client_class = RecordingAgentClient if record else AgentClient
    for i, (token, specs) in enumerate(hosts):
        sim = SimulatedBackend(specs, seed=i)
        sim.init()
        mps = MpsManager(sim.mps_control, mps_dir / str(i))
        hostname = f"{hostname_prefix}-{i:04d}"
        workloads = _workloads(
            sim,
            runtime,
            hostname,
            state_dir / str(i),
            allow_process=allow_process,
            process_as_agent_user=process_as_agent_user,
        )
        # threads=False: thousands of simulated agents share one loop (see AgentClient.threads).
        collector = Collector(
            sim,
            hostname=hostname,
            mps=mps,
            allow_mutation=allow_mutation,
            threads=False,
            runtime=runtime,
            owners=workloads.owners,
            process_runtime=allow_process,
            address=address,
        )
        clients.append(
            client_class(
                server=server,
                state=AgentState(token=token),
                backend=sim,
                collector=collector,
                mps=mps,
                allow_mutation=allow_mutation,
                interval_s=interval_s,
                seed=i,
                threads=False,
                workloads=workloads,
            )
        )
    return clients


def _workloads(
    sim: SimulatedBackend,
    runtime: AgentRuntime,
    hostname: str,
    state_dir: Path,
    *,
    allow_process: bool,
    process_as_agent_user: bool,
) -> WorkloadSync:
    """A simulated agent's supervisor; with ``none`` it has no thread and only reports the
    replicas it cannot run."""
    runtimes = build_runtimes(
        runtime,
        hostname=hostname,
        state_dir=state_dir,
        allow_process=allow_process,
        process_as_agent_user=process_as_agent_user,
        image_pull="if-not-present",
    )
    supervisor = Supervisor(
        runtimes,
        agent_runtime=runtime,
        state_dir=state_dir if runtimes else None,
        # The swarm's hosts share this machine's ports: each starts at its own place of the
        # range and skips a port something binds already.
        ports=PortAllocator(
            PortRange.parse(DEFAULT_PORT_RANGE),
            probe=bindable(DEFAULT_PUBLISH_ADDRESS),
            seed=hostname,
        ),
    )
    supervisor.start()
    return WorkloadSync(supervisor, sim, gpu_request=False)


async def run_swarm(
    server: str,
    hosts: Sequence[tuple[str, list[SimulatedGpuSpec]]],
    *,
    interval_s: float = 1.0,
    allow_mutation: bool = True,
    stop: asyncio.Event | None = None,
    hostname_prefix: str = "sim",
    record: bool = False,
    clients_out: list[AgentClient] | None = None,
    runtime: AgentRuntime = "none",
    state_dir: Path = Path("/tmp/fleet-swarm-workloads"),
    stop_workloads: bool = False,
    allow_process: bool = False,
    process_as_agent_user: bool = False,
    address: str | None = None,
) -> list[AgentClient]:
    """Run one simulated agent per host until ``stop`` is set; return the clients.

    ``stop_workloads``: on the way out, stop the workloads the agents run (the demo does, so
    that quitting it leaves nothing behind; a real agent's workloads outlive it).

    Starts are spread over one interval so a large swarm does not connect all at once.
    ``clients_out`` (when given) receives the clients as soon as they are built.
    """
    stop = stop or asyncio.Event()
    clients = build_clients(
        server,
        hosts,
        interval_s=interval_s,
        allow_mutation=allow_mutation,
        hostname_prefix=hostname_prefix,
        record=record,
        runtime=runtime,
        state_dir=state_dir,
        allow_process=allow_process,
        process_as_agent_user=process_as_agent_user,
        address=address,
    )
    if clients_out is not None:
        clients_out.extend(clients)

    async def run_one(i: int, client: AgentClient) -> None:
        await asyncio.sleep(interval_s * i / max(len(clients), 1))
        await client.run(stop)

    logger.info("starting %d simulated agents against %s", len(clients), server)
    try:
        await asyncio.gather(*(run_one(i, c) for i, c in enumerate(clients)))
    finally:
        for client in clients:  # their workloads keep running, as a real agent's do
            if client.workloads is not None:
                if stop_workloads:
                    client.workloads.supervisor.stop_everything(timeout_s=15)
                client.workloads.supervisor.close()
    return clients


def load_swarm_config(path: Path) -> tuple[str, list[tuple[str, list[SimulatedGpuSpec]]], float]:
    """``{"server": URL, "interval_s": 1.0, "hosts": [{"token": ..., "gpus": [spec, ...]}]}``
    (optional: ``"allow_mutation"``, default true; ``"hostname_prefix"``, default ``"sim"``;
    ``"runtime"``, default ``"none"``; ``"state_dir"``; ``"stop_workloads_on_exit"``, default
    false; ``"allow_process_runtime"`` and ``"process_as_agent_user"``, default false;
    ``"address"``, the hosts' address in hello, default none)."""
    import json

    raw = json.loads(path.read_text(encoding="utf-8"))
    hosts = [(str(h["token"]), list(h["gpus"])) for h in raw["hosts"]]
    return str(raw["server"]), hosts, float(raw.get("interval_s", 1.0))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hostagent.swarm CONFIG.json``: run the simulated agents until interrupted."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m hostagent.swarm", description=main.__doc__)
    parser.add_argument("config", type=Path, help="swarm config (JSON)")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--stats",
        type=Path,
        default=None,
        help="on exit, write what each agent sent (JSON: connections, telemetry ts) here",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    server, hosts, interval_s = load_swarm_config(args.config)
    import json

    extra = json.loads(args.config.read_text(encoding="utf-8"))
    clients: list[AgentClient] = []

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_swarm(
            server,
            hosts,
            interval_s=interval_s,
            stop=stop,
            allow_mutation=bool(extra.get("allow_mutation", True)),
            hostname_prefix=str(extra.get("hostname_prefix", "sim")),
            record=args.stats is not None,
            clients_out=clients,
            runtime=_runtime(extra.get("runtime", "none")),
            state_dir=Path(str(extra.get("state_dir", "/tmp/fleet-swarm-workloads"))),
            stop_workloads=bool(extra.get("stop_workloads_on_exit", False)),
            allow_process=bool(extra.get("allow_process_runtime", False)),
            process_as_agent_user=bool(extra.get("process_as_agent_user", False)),
            address=str(extra["address"]) if extra.get("address") else None,
        )

    asyncio.run(run())
    if args.stats is not None:
        args.stats.write_text(json.dumps(swarm_stats(clients)), encoding="utf-8")
    return 0


def _runtime(value: object) -> AgentRuntime:
    if value == "docker":
        return "docker"
    if value == "process":
        return "process"
    if value != "none":
        raise SystemExit(f"runtime must be docker, process or none, not {value!r}")
    return "none"


if __name__ == "__main__":
    raise SystemExit(main())
