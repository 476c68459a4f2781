"""``manage.py bench_placement``: replay an Alibaba GPU trace under the published FGD protocol.

Thin: reads the CSV files, calls :mod:`fleet.placement.bench`, prints the table, writes JSON.
"""

from __future__ import annotations

import csv
import json
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


class Command(BaseCommand):
    help = "Replay an Alibaba GPU trace (ATC'23 protocol) with placement policies, side by side."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--trace", default="default", help="pod list suffix, e.g. gpushare40")
        parser.add_argument("--pods", type=Path, help="pod list CSV (default: from --trace)")
        parser.add_argument("--nodes", type=Path, help="node list CSV (default: the GPU nodes)")
        parser.add_argument(
            "--policy",
            default=f"{DEFAULT_POLICY},fgd,bestfit,random",
            help=f"comma-separated: {', '.join(POLICIES)}",
        )
        parser.add_argument("--seeds", default="42", help="comma-separated seeds, e.g. 42,43,44")
        parser.add_argument("--json", type=Path, dest="json_out", help="write results here")
        parser.add_argument(
            "--published", type=Path, help="analysis_allo_discrete.csv (default: the shared copy)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        data = _data_dir()
        pods_path: Path = options["pods"] or data / "csv" / f"openb_pod_list_{options['trace']}.csv"
        nodes_path: Path = options["nodes"] or data / "csv" / "openb_node_list_gpu_node.csv"
        published_path: Path = options["published"] or (
            data / "fgd-expected-results" / "analysis_allo_discrete.csv"
        )
        policies = [p.strip() for p in options["policy"].split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            raise CommandError(
                f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}",
                returncode=2,
            )
        seeds = [int(s) for s in options["seeds"].split(",") if s.strip()]
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
