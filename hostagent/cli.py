"""``fleet-agent``: the host agent's command line.

Examples::

    fleet-agent --server https://fleet.example --enroll ENROLLMENT_TOKEN --token-file state.json
    fleet-agent --server http://127.0.0.1:8000 --token-file state.json --simulate gpus.json \\
        --allow-mutation
    fleet-agent --once --json               # read-only discovery + one sample, printed as JSON
    fleet-agent --probe --json              # read-only record of what NVML says on this host
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hostagent import __version__
from hostagent.client import EnrollError
from hostagent.collector import Collector
from hostagent.config import AgentConfig, ConfigError
from hostagent.daemon import build_backend, init_backend, run_agent
from hostagent.gpu.backend import GpuBackend, GpuUnavailable


def parser() -> argparse.ArgumentParser:
    """The argument parser (flags override ``FLEET_AGENT_*``)."""
    p = argparse.ArgumentParser(prog="fleet-agent", description="Fleet GPU host agent")
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument("--server", help="control plane base URL, e.g. https://fleet.example")
    auth = p.add_mutually_exclusive_group()
    auth.add_argument(
        "--enroll",
        metavar="TOKEN",
        help="one-time enrolment token (visible in ps: prefer --enroll-file)",
    )
    auth.add_argument(
        "--enroll-file",
        type=Path,
        metavar="PATH",
        help="read the one-time enrolment token from PATH ('-': standard input)",
    )
    auth.add_argument("--token", help="host token (prefer --token-file)")
    p.add_argument("--token-file", type=Path, help="state file holding the host token (0600)")
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow an http:// or ws:// server off loopback (the tokens travel in clear)",
    )
    p.add_argument("--backend", choices=["nvml", "simulated"])
    p.add_argument("--simulate", type=Path, metavar="SPEC.json", help="simulated GPU specs")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--allow-mutation", action="store_true", default=None, help="allow MIG/MPS changes"
    )
    p.add_argument("--interval", type=float, help="telemetry interval in seconds (default 1)")
    p.add_argument("--transport", choices=["ws", "rest"])
    p.add_argument("--mps-dir", type=Path)
    p.add_argument("--hostname")
    p.add_argument(
        "--fault-dir", type=Path, help="simulated backend: apply fault files dropped here"
    )
    p.add_argument(
        "--runtime",
        choices=["docker", "process", "none"],
        help="what runs the workloads (default: docker if its daemon answers, else process)",
    )
    p.add_argument(
        "--state-dir", type=Path, help="workload state and logs (default: beside --token-file)"
    )
    p.add_argument(
        "--allow-process-runtime",
        action="store_true",
        default=None,
        help="run process workloads (off: they are reported failed); each runs as its "
        "policy's non-root user, in a cgroup of its own where the agent can make one",
    )
    p.add_argument(
        "--process-as-agent-user",
        action="store_true",
        default=None,
        help="development only: a process workload without a user runs as the agent's own "
        "user (it can read the agent's token: never on a shared host)",
    )
    p.add_argument(
        "--cgroup-base",
        metavar="PATH",
        help="cgroup v2 path the process workloads' cgroups go under (default: the agent's own)",
    )
    p.add_argument(
        "--image-pull",
        choices=["always", "if-not-present"],
        help="pull a container's image before every start (always, the default) or only when "
        "it is missing (if-not-present: locally built images)",
    )
    p.add_argument(
        "--port-range",
        metavar="FIRST-LAST",
        help="host ports given to replicas, one per declared port (default 20000-29999)",
    )
    p.add_argument(
        "--container-network",
        metavar="NAME",
        help="Docker bridge network of containers without the host's network (default fleet; "
        "created when missing)",
    )
    p.add_argument(
        "--publish-address",
        metavar="IP",
        help="address the replicas' host ports are published at (default 127.0.0.1: this host "
        "only; the address a load balancer reaches, or 0.0.0.0, to serve others)",
    )
    p.add_argument(
        "--address",
        help="host name or IP other machines reach this host's replicas at, reported to the "
        "control plane (default: the publish address, or the hostname when it is 0.0.0.0)",
    )
    p.add_argument("--once", action="store_true", help="discover, sample once, print, exit")
    p.add_argument(
        "--probe",
        action="store_true",
        help="print a read-only record of the driver, profiles, instances and processes; exit",
    )
    p.add_argument(
        "--json", action="store_true", help="with --once: print JSON (--probe always does)"
    )
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def config_from_args(args: argparse.Namespace, base: AgentConfig) -> AgentConfig:
    """Overlay command-line flags on the environment configuration."""
    overrides = {
        "server": args.server,
        "token": args.token,
        "token_file": args.token_file,
        "enrollment_token": args.enroll or _read_enrollment(args.enroll_file),
        "insecure": args.insecure,
        "backend": args.backend or ("simulated" if args.simulate else None),
        "simulate": args.simulate,
        "seed": args.seed,
        "allow_mutation": args.allow_mutation,
        "interval_s": args.interval,
        "transport": args.transport,
        "mps_dir": args.mps_dir,
        "hostname": args.hostname,
        "fault_dir": args.fault_dir,
        "runtime": args.runtime,
        "state_dir": args.state_dir,
        "allow_process_runtime": args.allow_process_runtime,
        "process_as_agent_user": args.process_as_agent_user,
        "cgroup_base": args.cgroup_base,
        "image_pull": args.image_pull,
        "port_range": args.port_range,
        "container_network": args.container_network,
        "publish_address": args.publish_address,
        "address": args.address,
    }
    config = replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if config.interval_s <= 0:
        raise ConfigError("--interval must be positive")
    config.check_ports()
    return config


def _read_enrollment(path: Path | None) -> str | None:
    """The enrolment token from a file or standard input (``-``): not in ``ps`` or history."""
    if path is None:
        return None
    try:
        text = sys.stdin.read(4096) if str(path) == "-" else path.read_text()[:4096]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the enrolment token from {path}: {exc}") from exc
    token = text.strip()
    if not token or len(token.split()) != 1:
        raise ConfigError(f"{path} must hold the enrolment token alone")
    return token


def once(config: AgentConfig) -> dict[str, object]:
    """Discovery and one telemetry sample, read only (no mutation, no server)."""
    backend, mps = build_backend(config)
    init_backend(backend)
    try:
        collector = Collector(backend, hostname=config.hostname, mps=mps)
        return {
            "hello": collector.hello(applied_generation=0),
            "telemetry": collector.telemetry(),
        }
    finally:
        backend.shutdown()


def _probe_backend(config: AgentConfig) -> GpuBackend:
    if config.backend == "simulated" or config.simulate is not None:
        return build_backend(config)[0]
    # Not build_backend: the probe must not so much as construct an MPS manager.
    from hostagent.gpu.nvml import NvmlBackend

    return NvmlBackend()


def probe(config: AgentConfig) -> dict[str, Any]:
    """``--probe``: the backend's read-only record (changes nothing; no server, no MPS)."""
    backend = _probe_backend(config)
    try:
        backend.init()
    except GpuUnavailable as exc:
        return {**backend.probe(), "error": str(exc)}
    try:
        return backend.probe()
    finally:
        backend.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fleet-agent`` and ``python -m hostagent``."""
    args = parser().parse_args(argv)
    quiet = args.once or args.probe
    level = logging.WARNING - 10 * args.verbose if quiet else logging.INFO - 10 * args.verbose
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args, AgentConfig.from_env())
        if args.probe:
            record = probe(config)
            print(json.dumps(record, indent=2))
            return 0 if record.get("available", True) else 1
        if args.once:
            result = once(config)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                for gpu in result["hello"]["gpus"]:  # type: ignore[index]
                    print(f"{gpu['index']}: {gpu['name']} {gpu['uuid']} [{gpu['status']}]")
            return 0
        asyncio.run(run_agent(config))
    except (ConfigError, EnrollError) as exc:
        print(f"fleet-agent: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the loops survive their own errors (D1); this is the last resort
        logging.getLogger("hostagent").exception("fleet-agent stopped on an unexpected error")
        print(f"fleet-agent: unexpected error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
