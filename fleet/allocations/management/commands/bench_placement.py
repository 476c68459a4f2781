"""``manage.py bench_placement``: replay an Alibaba GPU trace under the published FGD protocol.

Thin: reads the CSV files, calls :mod:`fleet.placement.bench` (or, with ``--mig PRODUCT``,
:mod:`fleet.placement.migbench`), prints the table, writes JSON.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from fleet.placement.bench import (
    DEFAULT_POLICY,
    POLICIES,
    RunResult,
    published_means,
    run_one,
    summarize,
)
from fleet.placement.migbench import MIG_STRATEGIES, MigReport, resolve_product, run_mig
from fleet.placement.trace import parse_nodes, parse_pods

DATA = Path("..") / "shared" / "data" / "alibaba-gpu-v2023"


def _data_dir() -> Path:
    return (Path(settings.BASE_DIR) / DATA).resolve()


def _read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise CommandError(
            f"{path} does not exist (the shared data folder is ../shared/data).", returncode=2
        )
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _names(value: str, known: tuple[str, ...]) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CommandError(
            f"unknown policy {', '.join(unknown)}; choose from {', '.join(known)}", returncode=2
        )
    return names


def _ints(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError as error:
        raise CommandError(
            f"expected comma-separated integers, got {value!r}", returncode=2
        ) from error


class Command(BaseCommand):
    help = "Replay an Alibaba GPU trace (ATC'23 protocol) with placement policies, side by side."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--trace", default="default", help="pod list suffix, e.g. gpushare40")
        parser.add_argument("--pods", type=Path, help="pod list CSV (default: from --trace)")
        parser.add_argument("--nodes", type=Path, help="node list CSV (default: the GPU nodes)")
        parser.add_argument(
            "--policy",
            help=f"comma-separated: {', '.join(POLICIES)} (default {DEFAULT_POLICY},fgd,bestfit,"
            f"random); with --mig: {', '.join(MIG_STRATEGIES)} (default all)",
        )
        parser.add_argument("--seeds", default="42", help="comma-separated seeds, e.g. 42,43,44")
        parser.add_argument("--json", type=Path, dest="json_out", help="write results here")
        parser.add_argument(
            "--published", type=Path, help="analysis_allo_discrete.csv (default: the shared copy)"
        )
        parser.add_argument(
            "--mig", help="MIG variant on a fleet of this product (key or name, e.g. H100)"
        )
        parser.add_argument(
            "--mig-gpus",
            help="comma-separated churn fleet sizes (default: peak lower bound and 80 %% of it)",
        )
        parser.add_argument(
            "--time-limit", type=float, default=10.0, help="CP-SAT limit in seconds (--mig)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data = _data_dir()
        pods_path: Path = options["pods"] or data / "csv" / f"openb_pod_list_{options['trace']}.csv"
        if options["mig"]:
            self._handle_mig(pods_path, options)
            return
        nodes_path: Path = options["nodes"] or data / "csv" / "openb_node_list_gpu_node.csv"
        published_path: Path = options["published"] or (
            data / "fgd-expected-results" / "analysis_allo_discrete.csv"
        )
        policies = _names(options["policy"] or f"{DEFAULT_POLICY},fgd,bestfit,random", POLICIES)
        seeds = _ints(options["seeds"])
        nodes = parse_nodes(_read_rows(nodes_path))
        pods = parse_pods(_read_rows(pods_path))
        workload = pods_path.stem
        published = (
            published_means(_read_rows(published_path), workload)
            if published_path.is_file()
            else {}
        )
        results = self._run(nodes, pods, policies, seeds)
        self._print_table(results, published, len(nodes), sum(n.gpu_count for n in nodes))
        if options["json_out"]:
            payload = {
                "trace": workload,
                "nodes": len(nodes),
                "gpus": sum(n.gpu_count for n in nodes),
                "published_alloc_130": {k: round(v, 4) for k, v in published.items()},
                "results": results,
            }
            options["json_out"].write_text(json.dumps(payload, indent=1))
            self.stdout.write(f"wrote {options['json_out']}")

    def _handle_mig(self, pods_path: Path, options: dict[str, Any]) -> None:
        try:
            product = resolve_product(options["mig"])
        except ValueError as error:
            raise CommandError(str(error), returncode=2) from error
        strategies = _names(options["policy"] or ",".join(MIG_STRATEGIES), MIG_STRATEGIES)
        pods = parse_pods(_read_rows(pods_path))
        started = time.perf_counter()
        report = run_mig(
            pods,
            product,
            strategies=strategies,
            seeds=_ints(options["seeds"]),
            fleets=_ints(options["mig_gpus"] or ""),
            time_limit_s=options["time_limit"],
            clock=time.perf_counter,
        )
        self.stderr.write(f"MIG variant in {time.perf_counter() - started:.1f}s")
        self._print_mig(pods_path.stem, report)
        if options["json_out"]:
            payload = {"trace": pods_path.stem, "mig": report}
            options["json_out"].write_text(json.dumps(payload, indent=1))
            self.stdout.write(f"wrote {options['json_out']}")

    def _print_mig(self, workload: str, report: MigReport) -> None:
        offline = report["offline"]
        profiles = ", ".join(f"{n} {name}" for name, n in report["profiles"].items())
        self.stdout.write(
            f"{workload} on {report['product']}: {report['jobs']} jobs, "
            f"{report['instances']} instances ({profiles})"
        )
        self.stdout.write(
            f"lower bound {report['lower_bound']} GPUs; offline repack {offline['gpus_used']} "
            f"({'optimal' if offline['optimal'] else 'not proven'}, {offline['solver']})"
        )
        fleets = report["churn_fleets"]
        if not fleets:
            self.stdout.write("no creation/deletion times in this trace: churn not replayed")
        accept = " ".join(f"{f'accept@{n} %':>14}" for n in fleets)
        self.stdout.write(
            f"{'strategy':<20} {'seeds':>5} {'GPUs used':>10} {'gap %':>6} {accept} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'rank p50':>8} {'rank p99':>8}"
        )
        for name in dict.fromkeys(r["strategy"] for r in report["results"]):
            runs = [r for r in report["results"] if r["strategy"] == name]
            churn = runs[0]["churn"]
            rates = " ".join(f"{c['acceptance_percent']:>14.2f}" for c in churn)
            self.stdout.write(
                f"{name:<20} {len(runs):>5} "
                f"{statistics.fmean(r['gpus_used'] for r in runs):>10.1f} "
                f"{statistics.fmean(r['gap_percent'] for r in runs):>6.3f} {rates} "
                f"{max(r['decision_ms']['p50'] for r in runs):>7.3f} "
                f"{max(r['decision_ms']['p99'] for r in runs):>7.3f} "
                f"{max((c['rank_decision_ms']['p50'] for c in churn), default=0.0):>8.2f} "
                f"{max((c['rank_decision_ms']['p99'] for c in churn), default=0.0):>8.2f}"
            )

    def _run(self, nodes: Any, pods: Any, policies: list[str], seeds: list[int]) -> list[RunResult]:
        results: list[RunResult] = []
        for name in policies:
            for seed in seeds:
                started = time.perf_counter()
                result = run_one(nodes, pods, name, seed, clock=time.perf_counter)
                results.append(result)
                self.stderr.write(
                    f"{name} seed {seed}: A(130)={result['alloc_ratio']['130']:.2f}% "
                    f"in {time.perf_counter() - started:.1f}s"
                )
        return results

    def _print_table(
        self, results: list[RunResult], published: dict[str, float], nodes: int, gpus: int
    ) -> None:
        self.stdout.write(f"{nodes} nodes, {gpus} GPUs; A(130) = allocation at 130 % arrived load")
        header = (
            f"{'policy':<10} {'seeds':>5} {'trace mix':>9} {'A(130) %':>9} {'unalloc GPUs':>12} "
            f"{'failed':>8} {'p50 ms':>7} {'p99 ms':>7} {'published A(130)':>17}"
        )
        self.stdout.write(header)
        for row in summarize(results):
            pub = published.get(row["policy"])
            self.stdout.write(
                f"{row['policy']:<10} {row['seeds']:>5} "
                f"{'yes' if row['uses_trace_mix'] else 'no':>9} "
                f"{row['alloc_130_mean']:>9.2f} {row['unallocated_gpus_130_mean']:>12.1f} "
                f"{row['failed_pods_mean']:>8.1f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
                f"{'' if pub is None else f'{pub:.2f}':>17}"
            )
        for name in ("fgd", "bestfit"):
            if name in published:
                unalloc = (1 - published[name] / 100) * gpus
                self.stdout.write(
                    f"published {name}: A(130) {published[name]:.2f} %, "
                    f"{unalloc:.0f} GPUs unallocated"
                )
