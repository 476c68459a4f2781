"""``manage.py bench_placement``: replay an Alibaba GPU trace under the published FGD protocol.

Thin: reads the CSV files, calls :mod:`fleet.placement.benchmarks.bench` (``--policy product``
is the product engine through ``rank``), or with ``--mig PRODUCT``
:mod:`fleet.placement.benchmarks.migbench` (``--churn``: :mod:`.migchurn`), or with
``--decision-time`` :mod:`fleet.placement.benchmarks.decisions`, or with ``--repack``
:mod:`fleet.placement.benchmarks.repackfree` (CP-SAT repack plans against their bound and the
greedy plan on generated fleets); prints a table, writes JSON.
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

from fleet.placement.benchmarks.advisorbench import run_advisor
from fleet.placement.benchmarks.bench import (
    DEFAULT_POLICY,
    POLICIES,
    RunResult,
    published_means,
    run_one,
    summarize,
)
from fleet.placement.benchmarks.decisions import decision_times
from fleet.placement.benchmarks.migbench import (
    MIG_STRATEGIES,
    MigReport,
    resolve_product,
    run_mig,
)
from fleet.placement.benchmarks.migchurn import CHURN_STRATEGIES, ChurnReport, run_mig_churn
from fleet.placement.benchmarks.repackfree import repack_free
from fleet.placement.benchmarks.trace import parse_nodes, parse_pods
from fleet.placement.fit import STRATEGIES, Strategy

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


def _strategies(value: str) -> list[Strategy]:
    names = _names(value, STRATEGIES)
    return [s for n in names for s in STRATEGIES if s == n]


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
            help=f"comma-separated: {', '.join(POLICIES)} (default {DEFAULT_POLICY},fgd+,fgd,"
            f"bestfit,random); with --mig: {', '.join(MIG_STRATEGIES)} (default all); with "
            f"--mig --churn or --decision-time: {', '.join(STRATEGIES)}",
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
        parser.add_argument(
            "--churn",
            action="store_true",
            help="with --mig: the churn scenario of the sharing pods (fleet sized so first-fit "
            "accepts < 90 %%; --mig-gpus to choose it)",
        )
        parser.add_argument(
            "--advisor",
            action="store_true",
            help="with --mig: the layout advisor on the peak-waiting state of the tight churn "
            "fleet; --trace may list several traces; prints JSON per trace (objective, bound, "
            "gap %%, time)",
        )
        parser.add_argument(
            "--decision-time",
            action="store_true",
            help="time rank() on a synthetic fleet (--gpus, --decisions) and print JSON",
        )
        parser.add_argument(
            "--repack",
            action="store_true",
            help="repack plans (CP-SAT vs its bound vs greedy) on generated fleets: --repack-gpus, "
            "--repack-free, --seeds, --time-limit; prints JSON",
        )
        parser.add_argument("--repack-gpus", default="64,256", help="--repack fleet sizes")
        parser.add_argument("--repack-free", default="4,16", help="--repack: GPUs to free")
        parser.add_argument("--gpus", type=int, default=1000, help="--decision-time fleet size")
        parser.add_argument(
            "--decisions", type=int, default=500, help="--decision-time: timed decisions"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["decision_time"]:
            self._handle_decisions(options)
            return
        if options["repack"]:
            self._handle_repack(options)
            return
        data = _data_dir()
        if options["mig"] and options["advisor"]:
            self._handle_advisor(data, options)
            return
        pods_path: Path = options["pods"] or data / "csv" / f"openb_pod_list_{options['trace']}.csv"
        if options["mig"] and options["churn"]:
            self._handle_churn(pods_path, options)
            return
        if options["mig"]:
            self._handle_mig(pods_path, options)
            return
        nodes_path: Path = options["nodes"] or data / "csv" / "openb_node_list_gpu_node.csv"
        published_path: Path = options["published"] or (
            data / "fgd-expected-results" / "analysis_allo_discrete.csv"
        )
        policies = _names(
            options["policy"] or f"{DEFAULT_POLICY},fgd+,fgd,bestfit,random", POLICIES
        )
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

    def _handle_repack(self, options: dict[str, Any]) -> None:
        report = repack_free(
            time.perf_counter,
            gpu_counts=_ints(options["repack_gpus"]),
            free_counts=_ints(options["repack_free"]),
            seeds=_ints(options["seeds"]) or [42],
            time_limit_s=options["time_limit"],
        )
        text = json.dumps(report, indent=1)
        self.stdout.write(text)
        if options["json_out"]:
            options["json_out"].write_text(text)

    def _handle_advisor(self, data: Path, options: dict[str, Any]) -> None:
        try:
            product = resolve_product(options["mig"])
        except ValueError as error:
            raise CommandError(str(error), returncode=2) from error
        sizes = _ints(options["mig_gpus"] or "")
        runs = []
        for trace in options["trace"].split(","):
            path = options["pods"] or data / "csv" / f"openb_pod_list_{trace.strip()}.csv"
            found = run_advisor(
                parse_pods(_read_rows(path)),
                product,
                gpu_count=sizes[0] if sizes else None,
                time_limit_s=options["time_limit"],
                clock=time.perf_counter,
            )
            for run in found:
                runs.append({"trace": path.stem, **run})
                self.stdout.write(json.dumps(runs[-1]))
        if options["json_out"]:
            options["json_out"].write_text(json.dumps(runs, indent=1))
            self.stdout.write(f"wrote {options['json_out']}")

    def _handle_decisions(self, options: dict[str, Any]) -> None:
        strategies = _strategies(options["policy"] or "product")
        reports = [
            decision_times(
                time.perf_counter,
                gpu_count=options["gpus"],
                decisions=options["decisions"],
                seed=(_ints(options["seeds"]) or [42])[0],
                strategy=strategy,
            )
            for strategy in strategies
        ]
        text = json.dumps(reports, indent=1)
        self.stdout.write(text)
        if options["json_out"]:
            options["json_out"].write_text(text)

    def _handle_churn(self, pods_path: Path, options: dict[str, Any]) -> None:
        try:
            product = resolve_product(options["mig"])
        except ValueError as error:
            raise CommandError(str(error), returncode=2) from error
        strategies = _strategies(options["policy"] or ",".join(CHURN_STRATEGIES))
        sizes: list[int | None] = [*_ints(options["mig_gpus"] or "")] or [None]
        pods = parse_pods(_read_rows(pods_path))
        reports = [
            run_mig_churn(
                pods, product, strategies=strategies, gpu_count=size, clock=time.perf_counter
            )
            for size in sizes
        ]
        for report in reports:
            self._print_churn(pods_path.stem, report)
        if options["json_out"]:
            payload = {"trace": pods_path.stem, "mig_churn": reports}
            options["json_out"].write_text(json.dumps(payload, indent=1))
            self.stdout.write(f"wrote {options['json_out']}")

    def _print_churn(self, workload: str, report: ChurnReport) -> None:
        profiles = ", ".join(f"{n} {name}" for name, n in report["profiles"].items())
        self.stdout.write(
            f"{workload} sharing pods on {report['product']}: {report['jobs']} jobs ({profiles}); "
            f"peak {report['peak_gpus']} GPUs; fleet {report['gpus']} GPUs; fluid ceiling "
            f"{report['fluid_ceiling_percent']:.2f} %"
        )
        self.stdout.write(f"{'strategy':<20} {'accepted %':>10} {'p50 ms':>7} {'p99 ms':>7}")
        for run in report["runs"]:
            self.stdout.write(
                f"{run['strategy']:<20} {run['acceptance_percent']:>10.2f} "
                f"{run['decision_ms']['p50']:>7.3f} {run['decision_ms']['p99']:>7.3f}"
            )

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
            f"{'min-max':>13} {'failed':>8} {'p50 ms':>7} {'p99 ms':>7} {'published A(130)':>17}"
        )
        self.stdout.write(header)
        for row in summarize(results):
            pub = published.get(row["policy"])
            self.stdout.write(
                f"{row['policy']:<10} {row['seeds']:>5} "
                f"{'yes' if row['uses_trace_mix'] else 'no':>9} "
                f"{row['alloc_130_mean']:>9.2f} {row['unallocated_gpus_130_mean']:>12.1f} "
                f"{row['unallocated_gpus_130_min']:>6.1f}-{row['unallocated_gpus_130_max']:<6.1f} "
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
