"""The agent's run loop: build the backend, connect, stop gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from hostagent.client import AgentClient, enroll
from hostagent.collector import Collector
from hostagent.config import (
    AgentConfig,
    AgentState,
    ConfigError,
    ensure_private,
    load_specs,
    read_state,
    token_sha256,
)
from hostagent.faults import watch_faults
from hostagent.gpu.backend import BackendError, GpuBackend, GpuUnavailable, driver_branch
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager, SubprocessMpsControl
from hostagent.protocol import AgentRuntime
from hostagent.runtime import (
    Cgroups,
    RuntimeUnavailable,
    Supervisor,
    WorkloadSync,
    build_runtimes,
    default_runtime,
)
from hostagent.runtime.metrics import MetricsScraper
from hostagent.runtime.ports import PortAllocator, PortRange, bindable
from hostagent.transport import server_problem

logger = logging.getLogger(__name__)

# The MIG user guide's minimum for A100/A30 MIG; R535 is what current NVML behaviour is known on.
MIN_DRIVER_BRANCH = 525
RECOMMENDED_DRIVER_BRANCH = 535
# How long SIGTERM waits for an apply in flight before NVML is shut down (review D17). A MIG
# reshape with an Ampere reset and MPS restarts fits; a hung driver call does not hold the stop.
APPLY_DRAIN_S = 60.0


def build_backend(config: AgentConfig) -> tuple[GpuBackend, MpsManager]:
    """The configured backend (not yet initialised) and its MPS manager."""
    if config.backend == "simulated" or config.simulate is not None:
        if config.simulate is None:
            raise ConfigError("--backend simulated needs --simulate SPEC.json")
        specs, seed = load_specs(config.simulate)
        sim = SimulatedBackend(
            specs,
            seed=seed if seed is not None else config.seed,
            state_file=config.workload_dir / "simulated-gpus.json",
        )
        return sim, MpsManager(sim.mps_control, config.mps_dir)
    from hostagent.gpu.nvml import NvmlBackend  # the one place the NVML module is loaded

    return NvmlBackend(), MpsManager(SubprocessMpsControl(), config.mps_dir)


def init_backend(backend: GpuBackend) -> None:
    """Initialise; without NVML the agent still runs and reports no GPUs (``unavailable``).

    Any failure is survived (review D1): a driver upgraded without a reboot fails ``nvmlInit``
    with 18 (driver/library mismatch), and pynvml's ``NVMLLibraryMismatchError`` is not even an
    ``NVMLError``. The collector retries every 30 s.
    """
    try:
        backend.init()
    except GpuUnavailable as exc:
        logger.warning("no usable NVIDIA driver (%s); reporting GPUs as unavailable", exc)
    except BackendError as exc:
        logger.warning("the NVIDIA driver failed to initialise (%s); retrying every 30 s", exc)
    except Exception:
        logger.exception("the GPU backend failed to initialise; retrying every 30 s")


def check_host(backend: GpuBackend) -> None:
    """Warn at start about what keeps MIG from working here; the agent runs anyway (telemetry
    works on any driver). The driver version also goes to the server in ``hello``."""
    if backend.kind == "nvml" and os.geteuid() != 0:
        logger.warning(
            "not running as root: MIG placement discovery and changes need root or the NVML "
            "capabilities mig/config and mig/monitor (nvml.h: 'Requires privileged user')"
        )
    if not backend.available():
        return
    try:
        version = backend.driver_version()
    except Exception as exc:
        logger.warning("cannot read the driver version: %s", exc)
        return
    _check_driver(version)


def _check_driver(version: str | None) -> None:
    branch = driver_branch(version)
    if branch is None:
        logger.warning("unknown NVIDIA driver version %r", version)
    elif branch < MIN_DRIVER_BRANCH:
        # Before R510 the V-variant profile calls do not exist at all (review D14).
        logger.warning(
            "NVIDIA driver %s is older than R%s, the minimum for MIG on A100/A30 (R%s+ "
            "recommended): MIG discovery and changes may fail; telemetry still works",
            version,
            MIN_DRIVER_BRANCH,
            RECOMMENDED_DRIVER_BRANCH,
        )
    elif branch < RECOMMENDED_DRIVER_BRANCH:
        logger.info("NVIDIA driver %s: R%s+ is recommended", version, RECOMMENDED_DRIVER_BRANCH)


def resolve_state(config: AgentConfig) -> AgentState:
    """Enrol if asked to and not enrolled yet, else read the token from the environment or
    the state file."""
    if config.server is None:
        raise ConfigError("--server (FLEET_AGENT_SERVER) is required")
    problem = server_problem(config.server, insecure=config.insecure)
    if problem is not None:
        raise ConfigError(problem)
    stored = read_state(config.token_file)
    if config.enrollment_token and stored is None:
        return enroll(config.server, config.enrollment_token, config.hostname, config.token_file)
    if config.enrollment_token:
        # Enrolment tokens are single-use: a service restarted with the same environment
        # (systemd's Restart=always) goes on with the host token it already traded it for.
        logger.info("already enrolled (%s): the enrolment token is not used", config.token_file)
    if config.token:
        given = token_sha256(config.token)
        if stored is not None and stored.given_token_sha256 == given:
            # The server renewed the token given here (it expires): the renewed one holds.
            if stored.token != config.token:
                logger.info("using the renewed host token in %s", config.token_file)
            return stored
        generation = stored.applied_generation if stored else 0
        return AgentState(
            token=config.token, applied_generation=generation, given_token_sha256=given
        )
    if stored is None:
        raise ConfigError(
            f"no token: pass --enroll TOKEN or --token-file (tried {config.token_file})"
        )
    return stored


def resolve_runtime(config: AgentConfig) -> AgentRuntime:
    """The runtime asked for, else ``docker`` when its daemon answers, else ``process``.

    An agent without ``--allow-mutation`` changes nothing on its host, and starting workloads
    is a change: it runs none (and asking for a runtime without it is an error).
    """
    if not config.allow_mutation:
        if config.runtime not in (None, "none"):
            raise ConfigError(
                f"--runtime {config.runtime} starts workloads on this host: it needs "
                "--allow-mutation"
            )
        return "none"
    return config.runtime or default_runtime()


def build_workloads(
    config: AgentConfig, backend: GpuBackend, runtime: AgentRuntime
) -> WorkloadSync:
    """The supervisor of this agent's workloads (reporting ``failed`` for every workload when
    the runtime is ``none``, and for process workloads without ``--allow-process-runtime``)."""
    allow_process = config.allow_process_runtime and runtime != "none"
    if runtime != "none" and not allow_process:
        logger.info("process workloads are off (start with --allow-process-runtime to run them)")
    if allow_process and config.process_as_agent_user:
        logger.warning(
            "--process-as-agent-user: process workloads without a user run as uid %d, "
            "and can read this agent's token; for development only",
            os.geteuid(),
        )
    cgroups = Cgroups(base=config.cgroup_base) if allow_process else None
    if cgroups is not None and not cgroups.available:
        logger.warning(
            "process workloads get no cgroup (%s): their memory is not confined", cgroups.problem
        )
    try:
        ensure_private(config.workload_dir, 0o700)
        runtimes = build_runtimes(
            runtime,
            hostname=config.hostname,
            state_dir=config.workload_dir,
            allow_process=allow_process,
            process_as_agent_user=config.process_as_agent_user,
            cgroups=cgroups,
            image_pull=config.image_pull,
            network=config.container_network,
            publish_address=config.publish_address,
        )
    except RuntimeUnavailable as exc:
        raise ConfigError(f"--runtime {runtime}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot use {config.workload_dir}: {exc}") from exc
    supervisor = Supervisor(
        runtimes,
        agent_runtime=runtime,
        state_dir=config.workload_dir if runtimes else None,
        ports=PortAllocator(
            PortRange.parse(config.port_range),
            probe=bindable(config.publish_address),
            seed=config.hostname,
        ),
    )
    return WorkloadSync(supervisor, backend, gpu_request=backend.kind == "nvml")


async def run_agent(config: AgentConfig, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    state = resolve_state(config)
    ensure_private(config.token_file, 0o600)
    backend, mps = build_backend(config)
    init_backend(backend)
    check_host(backend)
    runtime = resolve_runtime(config)
    workloads = build_workloads(config, backend, runtime)
    workloads.supervisor.start()
    scraper = MetricsScraper(workloads.supervisor.scrape_targets)
    if workloads.supervisor.runtimes:
        scraper.start()
    collector = Collector(
        backend,
        hostname=config.hostname,
        mps=mps,
        allow_mutation=config.allow_mutation,
        runtime=runtime,
        owners=workloads.owners,
        process_runtime=config.allow_process_runtime,
        address=config.reported_address,
        metrics=scraper.readings,
    )
    assert config.server is not None  # checked by resolve_state
    client = AgentClient(
        server=config.server,
        state=state,
        backend=backend,
        collector=collector,
        mps=mps,
        allow_mutation=config.allow_mutation,
        interval_s=config.interval_s,
        state_file=config.token_file,
        workloads=workloads,
    )
    logger.info(
        "agent %s starting (%s backend, %s transport, mutation %s, %s runtime)",
        config.hostname,
        backend.kind,
        config.transport,
        "allowed" if config.allow_mutation else "disabled",
        runtime,
    )
    faults = None
    if config.fault_dir is not None:
        if not isinstance(backend, SimulatedBackend):
            raise ConfigError("--fault-dir needs the simulated backend")
        faults = asyncio.create_task(watch_faults(backend, config.fault_dir, stop))
    try:
        if config.transport == "rest":
            await client.run_rest(stop)
        else:
            await client.run(stop)
    finally:
        if faults is not None:
            faults.cancel()
        scraper.close()
        await _stop(client, collector, backend)
        # The workloads keep running: the next agent adopts them (unreachable is not failed).
        workloads.supervisor.close()


async def _stop(client: AgentClient, collector: Collector, backend: GpuBackend) -> None:
    """Shut NVML down only once no apply thread is using it (review D17)."""
    if not await client.settle(APPLY_DRAIN_S):
        logger.warning("an apply still runs after %.0f s; shutting down anyway", APPLY_DRAIN_S)
    collector.close()
    try:
        backend.shutdown()
    except Exception as exc:
        logger.warning("GPU backend shutdown failed: %s", exc)
    logger.info("agent stopped")
