"""The agent's run loop: build the backend, connect, stop gracefully on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from hostagent.client import AgentClient, enroll
from hostagent.collector import Collector
from hostagent.config import AgentConfig, AgentState, ConfigError, load_specs, read_state
from hostagent.faults import watch_faults
from hostagent.gpu.backend import GpuBackend, GpuUnavailable
from hostagent.gpu.simulated import SimulatedBackend
from hostagent.mps import MpsManager, SubprocessMpsControl

logger = logging.getLogger(__name__)


def build_backend(config: AgentConfig) -> tuple[GpuBackend, MpsManager]:
    """The configured backend (not yet initialised) and its MPS manager."""
    if config.backend == "simulated" or config.simulate is not None:
        if config.simulate is None:
            raise ConfigError("--backend simulated needs --simulate SPEC.json")
        specs, seed = load_specs(config.simulate)
        sim = SimulatedBackend(specs, seed=seed if seed is not None else config.seed)
        return sim, MpsManager(sim.mps_control, config.mps_dir)
    from hostagent.gpu.nvml import NvmlBackend  # the one place the NVML module is loaded

    return NvmlBackend(), MpsManager(SubprocessMpsControl(), config.mps_dir)


def init_backend(backend: GpuBackend) -> None:
    """Initialise; without NVML the agent still runs and reports no GPUs (``unavailable``)."""
    try:
        backend.init()
    except GpuUnavailable as exc:
        logger.warning("no usable NVIDIA driver (%s); reporting GPUs as unavailable", exc)


def resolve_state(config: AgentConfig) -> AgentState:
    """Enrol if asked to, else read the token from the environment or the state file."""
    if config.server is None:
        raise ConfigError("--server (FLEET_AGENT_SERVER) is required")
    if config.enrollment_token:
        return enroll(config.server, config.enrollment_token, config.hostname, config.token_file)
    stored = read_state(config.token_file)
    if config.token:
        generation = stored.applied_generation if stored else 0
        return AgentState(token=config.token, applied_generation=generation)
    if stored is None:
        raise ConfigError(
            f"no token: pass --enroll TOKEN or --token-file (tried {config.token_file})"
        )
    return stored


async def run_agent(config: AgentConfig, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGINT/SIGTERM arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    state = resolve_state(config)
    backend, mps = build_backend(config)
    init_backend(backend)
    collector = Collector(
        backend, hostname=config.hostname, mps=mps, allow_mutation=config.allow_mutation
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
    )
    logger.info(
        "agent %s starting (%s backend, %s transport, mutation %s)",
        config.hostname,
        backend.kind,
        config.transport,
        "allowed" if config.allow_mutation else "disabled",
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
        backend.shutdown()
        logger.info("agent stopped")
