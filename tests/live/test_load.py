"""The load monitor: a process behind for a second coarsens, one that is calm and has room below
comes back, and it never flaps between levels as coarsening relieves it."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured

from fleet.live import load as load_module
from fleet.live.load import LoadMonitor, Pressure, fits_below, levels, pressed
from fleet.settings.env import env_floats
from hostagent import protocol


class Listener:
    def __init__(self) -> None:
        self.heard: list[int] = []

    def load_changed(self, level) -> None:
        self.heard.append(level.number)


def monitor_at(monkeypatch, now: list[float]) -> LoadMonitor:
    monkeypatch.setattr(load_module.time, "monotonic", lambda: now[0])

    async def make() -> LoadMonitor:
        return LoadMonitor(asyncio.get_running_loop())

    return async_to_sync(make)()


def test_the_levels_coarsen_reporting_batches_and_frames():
    normal, busy, overloaded = levels()
    assert normal.telemetry_interval_s < 1 <= busy.telemetry_interval_s
    assert busy.telemetry_interval_s <= overloaded.telemetry_interval_s
    assert normal.batch_window_s <= busy.batch_window_s <= overloaded.batch_window_s
    assert normal.browser_flush_s <= busy.browser_flush_s
    # Heartbeats ride on telemetry: the slowest pace stays well inside the offline limit.
    assert overloaded.telemetry_interval_s <= 5.0


def test_pressure_is_lag_backlog_or_a_full_core():
    assert not pressed(Pressure())
    assert pressed(Pressure(lag_s=0.4))
    assert pressed(Pressure(backlog_s=2.0))
    assert pressed(Pressure(cpu=0.95))


def test_a_level_rises_after_a_second_of_pressure_and_tells_its_listeners(monkeypatch):
    now = [100.0]
    monitor = monitor_at(monkeypatch, now)
    listener = Listener()
    monitor.listen(listener)
    monitor.pressure = Pressure(lag_s=0.5)
    monitor._decide(now[0])
    assert monitor.level.number == 0  # not at the first probe
    now[0] += 1.1
    monitor._decide(now[0])
    assert monitor.level.number == 1 and listener.heard == [1]
    now[0] += 1.1
    monitor._decide(now[0])
    assert monitor.level.number == 1  # the agents take a while to follow: it settles first
    now[0] += load_module.SETTLE_S
    monitor._decide(now[0])
    now[0] += 1.1
    monitor._decide(now[0])
    assert monitor.level.number == 2 and listener.heard == [1, 2]


def test_a_level_comes_down_only_after_calm_and_with_room_below(monkeypatch):
    now = [100.0]
    monitor = monitor_at(monkeypatch, now)
    monitor.force(2)
    monitor.forced = None
    # Calm, but the CPU it uses now would not fit at the faster reporting below: it stays.
    monitor.pressure = Pressure(lag_s=0.01, backlog_s=0.1, cpu=0.5)
    for _ in range(30):
        now[0] += 1.0
        monitor._decide(now[0])
    assert monitor.level.number == 2
    monitor.pressure = Pressure(lag_s=0.01, backlog_s=0.1, cpu=0.1)
    now[0] += 1.0
    monitor._decide(now[0])
    assert monitor.level.number == 2  # not at once
    now[0] += load_module.DOWN_AFTER_S
    monitor._decide(now[0])
    assert monitor.level.number == 1


def test_room_below_scales_the_cpu_to_the_faster_reporting():
    normal, busy, _overloaded = levels()
    calm = Pressure(lag_s=0.0, backlog_s=0.0, cpu=0.2)
    assert fits_below(calm, busy, normal)
    assert not fits_below(Pressure(cpu=0.4), busy, normal)  # 0.4 x 2 = 0.8: no room
    assert not fits_below(Pressure(lag_s=0.2, cpu=0.1), busy, normal)  # not calm


def test_the_pace_message_is_a_valid_protocol_message(monkeypatch):
    now = [1.0]
    monitor = monitor_at(monkeypatch, now)
    for level in (1, 2, 0):
        monitor.force(level)
        message = monitor.pace_message()
        assert protocol.decode(protocol.encode(message))["type"] == "pace"  # type: ignore[arg-type]


def test_degraded_intervals_are_checked_at_start(monkeypatch):
    monkeypatch.setenv("FLEET_X", "3,2")
    with pytest.raises(ImproperlyConfigured, match="not decreasing"):
        env_floats("FLEET_X", (2.0, 3.0), low=1.0, high=10.0)
    monkeypatch.setenv("FLEET_X", "2,30")
    with pytest.raises(ImproperlyConfigured, match="from 1 to 10"):
        env_floats("FLEET_X", (2.0, 3.0), low=1.0, high=10.0)
    monkeypatch.setenv("FLEET_X", "1.5,4")
    assert env_floats("FLEET_X", (2.0, 3.0), low=1.0, high=10.0) == (1.5, 4.0)
