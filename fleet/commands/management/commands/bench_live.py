"""``manage.py bench_live --hosts N --gpus-per-host 8 --seconds S --json OUT``: simulated agents
and browser sockets against the real stack (its own, or ``--url``); prints JSON.

See :mod:`fleet.bench.live` for what is measured and how ``dropped`` is defined.
"""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.live import run_bench
from fleet.bench.options import Options, default_servers
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--hosts", type=int, required=True)
        parser.add_argument("--gpus-per-host", type=int, default=8)
        parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
        parser.add_argument(
            "--servers",
            type=int,
            default=default_servers(),
            help="ASGI processes, agents and browsers split across them (default: one per CPU "
            "core, at most 4, as the production topology runs them)",
        )
        parser.add_argument(
            "--new-hosts",
            action="store_true",
            help="hosts whose GPUs the server has never seen (the agents' first hellos adopt "
            "them during the warm-up); default: an enrolled fleet reconnecting",
        )
        parser.add_argument("--browsers", type=int, default=2, help="browser sockets")
        parser.add_argument("--agent-processes", type=int, default=0, help="0: one per 400 hosts")
        parser.add_argument("--interval", type=float, default=1.0, help="agent tick (s)")
        parser.add_argument("--product", default="h100-sxm5-80gb")
        parser.add_argument(
            "--url",
            action="append",
            default=[],
            help="use this running server instead of starting a stack (repeatable); the hosts "
            "are created in this command's database and deleted afterwards",
        )
        parser.add_argument("--server-pid", type=int, action="append", default=[])
        parser.add_argument("--warmup-timeout", type=float, default=120.0)
        parser.add_argument("--channel-capacity", type=int, default=None)
        parser.add_argument(
            "--live-batch", type=float, default=None, help="FLEET_LIVE_BATCH_SECONDS for servers"
        )
        parser.add_argument(
            "--restart-at",
            type=float,
            default=None,
            help="restart every ASGI server once, this many seconds into the window (a restart "
            "storm: reports how fast hosts report again, samples lost and replicas moved)",
        )
        parser.add_argument(
            "--replicas",
            type=int,
            default=-1,
            help="whole-GPU replicas placed before the run (default: one per 10 hosts with "
            "--goal storm or overload, else none)",
        )
        parser.add_argument(
            "--goal",
            choices=["latency", "storm", "overload"],
            default="",
            help="what goal_met checks (default: storm with --restart-at, else latency); storm "
            "and overload also run a Celery worker and beat",
        )
        parser.add_argument(
            "--require-goal",
            action="store_true",
            help="exit non-zero when the goal is not met (a warm-up that does not complete "
            "always does)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def interrupted(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, interrupted)
        result = run_bench(
            Options(
                hosts=options["hosts"],
                gpus_per_host=options["gpus_per_host"],
                seconds=options["seconds"],
                servers=options["servers"],
                enrolled=not options["new_hosts"],
                browsers=options["browsers"],
                swarms=options["agent_processes"],
                product=options["product"],
                interval_s=options["interval"],
                urls=options["url"],
                database_url=options["database_url"],
                warmup_timeout_s=options["warmup_timeout"],
                channel_capacity=options["channel_capacity"],
                live_batch_s=options["live_batch"],
                workdir=options["workdir"],
                server_pids=options["server_pid"],
                restart_at=options["restart_at"],
                replicas=options["replicas"],
                goal=options["goal"],
                log=self.log,
            )
        )
        self.emit(result, options)
        if not result["warmup_complete"]:
            raise CommandError(
                f"the warm-up did not complete in {options['warmup_timeout']:.0f} s: not every "
                "GPU reached a browser (goal_met is false)"
            )
        if options["require_goal"] and not result["goal_met"]:
            failed = [name for name, ok in result["goals"].items() if not ok]
            raise CommandError(f"goal {result['goal']} not met: {', '.join(failed)}")
