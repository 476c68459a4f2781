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
from hostagent.protocol import SimulatedGpuSpec, UpMessage

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
    """Per host token: connections made and the ``ts`` of each telemetry message sent."""
    return {
        "hosts": [
            {
                "token": c.state.token,
                "connections": c.connections,
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
) -> list[AgentClient]:
    """One client per ``(host token, GPU specs)``; host ``i`` uses seed ``i``.

    ``record``: :class:`RecordingAgentClient` (remembers what it sent) instead of the plain one.
    """
    clients = []
    client_class = RecordingAgentClient if record else AgentClient
    for i, (token, specs) in enumerate(hosts):
        sim = SimulatedBackend(specs, seed=i)
        sim.init()
        mps = MpsManager(sim.mps_control, mps_dir / str(i))
        collector = Collector(
            sim, hostname=f"{hostname_prefix}-{i:04d}", mps=mps, allow_mutation=allow_mutation
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
            )
        )
    return clients


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
) -> list[AgentClient]:
    """Run one simulated agent per host until ``stop`` is set; return the clients.

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
    )
    if clients_out is not None:
        clients_out.extend(clients)

    async def run_one(i: int, client: AgentClient) -> None:
        await asyncio.sleep(interval_s * i / max(len(clients), 1))
        await client.run(stop)

    logger.info("starting %d simulated agents against %s", len(clients), server)
    await asyncio.gather(*(run_one(i, c) for i, c in enumerate(clients)))
    return clients


def load_swarm_config(path: Path) -> tuple[str, list[tuple[str, list[SimulatedGpuSpec]]], float]:
    """``{"server": URL, "interval_s": 1.0, "hosts": [{"token": ..., "gpus": [spec, ...]}]}``
    (optional: ``"allow_mutation"``, default true; ``"hostname_prefix"``, default ``"sim"``)."""
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
        )

    asyncio.run(run())
    if args.stats is not None:
        args.stats.write_text(json.dumps(swarm_stats(clients)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
