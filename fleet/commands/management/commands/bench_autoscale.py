"""``manage.py bench_autoscale --trace conv|code --seconds 150 --json OUT``: an Azure LLM inference
trace replayed through a Fleet gateway (HAProxy) against static peak, static median and Fleet's
autoscaling, on the production stack (its own, on loopback); prints JSON. See
:mod:`fleet.bench.autoscale` for the modes and :mod:`fleet.bench.autoscale_report` for the
figures and the goals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from fleet.bench.autoscale import MODES, AutoscaleOptions, run_autoscale_bench
from fleet.bench.autoscale_trace import TRACES
from fleet.commands.bench import StackBenchCommand


class Command(StackBenchCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--trace", choices=sorted(TRACES), default="conv")
        parser.add_argument(
            "--seconds", type=float, default=150.0, help="each mode's replay length (s)"
        )
        parser.add_argument(
            "--modes",
            default=",".join(MODES),
            help=f"comma-separated, static_peak first (it sets the SLO): {', '.join(MODES)}",
        )
        parser.add_argument(
            "--sharpen", action="store_true", help="x2 arrival rate over the busiest 30 s"
        )
        parser.add_argument(
            "--concurrency", type=int, default=8, help="requests one replica serves at once (C)"
        )
        parser.add_argument(
            "--target", type=float, default=5.0, help="autoscaling target, in flight per replica"
        )
        parser.add_argument(
            "--metric",
            choices=["in_flight", "requests"],
            default="in_flight",
            help="the autoscaler's metric: in flight per replica (--target), or requests per "
            "replica per second (--rate-target, else the rate that keeps --target in flight)",
        )
        parser.add_argument(
            "--rate-target", type=float, default=None, help="requests per replica per second"
        )
        parser.add_argument(
            "--trace-minutes",
            type=float,
            default=None,
            help="replay only the trace's first minutes (milder compression)",
        )
        parser.add_argument(
            "--max-step-out",
            type=int,
            default=None,
            help="at most this many replicas added per scale-out, or a doubling (the rule's step "
            "limit); default: none",
        )
        parser.add_argument(
            "--scale-in-cooldown",
            type=float,
            default=300.0,
            help="the policy's scale-in cooldown (and stabilization window), in trace seconds "
            "(compressed with the trace); default 300",
        )
        parser.add_argument("--hosts", type=int, default=4, help="simulated hosts, 4 GPUs each")
        parser.add_argument(
            "--trace-file", type=Path, default=None, help="another CSV in the trace's format"
        )
        parser.add_argument(
            "--require-goal", action="store_true", help="exit 1 when a goal is missed"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        modes = tuple(m for m in str(options["modes"]).split(",") if m)
        unknown = sorted(set(modes) - set(MODES))
        if unknown or not modes:
            raise CommandError(f"--modes: unknown {unknown[:1]} (known: {', '.join(MODES)})")
        if len(set(modes)) != len(modes):
            raise CommandError("--modes: each mode once")
        if "static_peak" in modes and modes[0] != "static_peak":
            raise CommandError("--modes: static_peak runs first: its p99 sets the SLO")
        if not 10 <= options["seconds"] <= 3600:
            raise CommandError("--seconds must be 10..3600")
        if not 1 <= options["concurrency"] <= 256:
            raise CommandError("--concurrency must be 1..256")
        if not 0.1 <= options["target"] <= options["concurrency"]:
            raise CommandError("--target must be 0.1..--concurrency")
        if options["rate_target"] is not None and not 0.01 <= options["rate_target"] <= 10_000:
            raise CommandError("--rate-target must be 0.01..10000")
        if options["trace_minutes"] is not None and not 1 <= options["trace_minutes"] <= 600:
            raise CommandError("--trace-minutes must be 1..600")
        if options["max_step_out"] is not None and not 1 <= options["max_step_out"] <= 1000:
            raise CommandError("--max-step-out must be 1..1000")
        if not 0 <= options["scale_in_cooldown"] <= 3600:
            raise CommandError("--scale-in-cooldown must be 0..3600 trace seconds")
        if not 1 <= options["hosts"] <= 16:
            raise CommandError("--hosts must be 1..16")
        trace_file = options["trace_file"] or TRACES[options["trace"]]
        if not Path(trace_file).is_file():
            raise CommandError(f"the trace {trace_file} is not there (see the data README)")
        if shutil.which("haproxy") is None:
            raise CommandError("bench_autoscale needs HAProxy: apt-get install haproxy")
        self.require_postgres(options)
        result = run_autoscale_bench(
            AutoscaleOptions(
                trace=options["trace"],
                seconds=options["seconds"],
                modes=modes,
                sharpen=options["sharpen"],
                concurrency=options["concurrency"],
                target=options["target"],
                metric=options["metric"],
                rate_target=options["rate_target"],
                trace_minutes=options["trace_minutes"],
                max_step_out=options["max_step_out"],
                scale_in_cooldown_s=options["scale_in_cooldown"],
                hosts=options["hosts"],
                trace_path=options["trace_file"],
                database_url=options["database_url"],
                workdir=options["workdir"],
                log=self.log,
            )
        )
        self.emit(result, options)
        if options["require_goal"] and not result["goal_met"]:
            missed = [name for name, ok in result["goals"].items() if not ok]
            raise CommandError(f"goal missed: {'; '.join(missed)}")
