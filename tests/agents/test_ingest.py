"""Telemetry ingest in batches: every known sample stored, another host's GPUs never written, a
fixed number of queries whatever the number of hosts, health always current, values rounded
once and ``None`` kept."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.agents import ingest
from fleet.agents.discovery import gpus_adopt
from fleet.inventory import selectors
from fleet.inventory.models import Gpu, GpuHealth, Host
from fleet.inventory.services import host_create
from tests.agent_sim import SimAgent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("mem_store")]


def enrolled(
    n: int, products: list[str] | None = None, prefix: str = "h"
) -> list[tuple[Host, SimAgent]]:
    out = []
    for i in range(n):
        host, _ = host_create(name=f"{prefix}{i}")
        agent = SimAgent(products or ["h100-sxm5-80gb", "a30-24gb"], seed=100 + i)
        gpus_adopt(host=host, gpus=agent.hello()["gpus"])
        out.append((Host.objects.get(pk=host.pk), agent))
    return out


def ticks_of(hosts: list[tuple[Host, SimAgent]]) -> list[ingest.Tick]:
    now = time.time()
    return [
        ingest.Tick(h.pk, h.created_at.timestamp(), now, agent.telemetry()) for h, agent in hosts
    ]


def queries(fn: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured.captured_queries)


def test_a_batch_stores_every_known_sample_and_returns_the_live_values():
    hosts = enrolled(3)
    done = ingest.ingest(ticks_of(hosts))
    gpu_ids = list(Gpu.objects.values_list("pk", flat=True))
    assert done.samples == len(gpu_ids) == 6
    assert sorted(int(k) for k in done.live) == sorted(gpu_ids)
    assert done.host_ids == sorted(h.pk for h, _ in hosts)
    assert set(selectors.latest_telemetry(gpu_ids)) == set(gpu_ids)
    assert all(h.last_seen_at is not None for h in Host.objects.all())


def test_the_queries_of_a_batch_do_not_grow_with_the_number_of_hosts():
    few = enrolled(2)
    many = few + enrolled(10, prefix="more")
    cold_few = queries(lambda: ingest.ingest(ticks_of(few)))
    ingest.forget_all()
    cold_many = queries(lambda: ingest.ingest(ticks_of(many)))
    # GPU maps (GPUs, MIG partitions, replicas), health, last_seen (the free host rows locked
    # first, in a savepoint here), the hosts back from offline and the webhooks that want to
    # hear of it: a handful, whatever the count
    assert cold_few == cold_many <= 11
    # Warm: the GPU maps are cached and last_seen was written just now.
    assert queries(lambda: ingest.ingest(ticks_of(many))) == 1  # health only


def test_a_gpu_of_another_host_is_ignored_and_never_written():
    (_victim, victim_agent), (attacker, _) = enrolled(2)
    stolen = victim_agent.telemetry()
    tick = ingest.Tick(attacker.pk, attacker.created_at.timestamp(), time.time(), stolen)
    done = ingest.ingest([tick])
    assert done.samples == 0 and done.live == {}
    assert selectors.latest_telemetry(Gpu.objects.values_list("pk", flat=True)) == {}


def test_health_in_live_values_is_current_even_with_a_cached_map():
    hosts = enrolled(1)
    first = ingest.ingest(ticks_of(hosts))
    assert {v["health"] for v in first.live.values()} == {"healthy"}
    gpu = Gpu.objects.order_by("pk").first()
    Gpu.objects.filter(pk=gpu.pk).update(health=GpuHealth.UNHEALTHY)
    second = ingest.ingest(ticks_of(hosts))
    assert second.live[str(gpu.pk)]["health"] == "unhealthy"


def test_values_are_rounded_once_and_none_stays_none():
    (host, agent), *_ = enrolled(1, ["a30-24gb"])
    message = agent.telemetry()
    sample = message["gpus"][0]
    sample["utilization_gpu_percent"] = 41.26
    sample["power_mw"] = 301_234
    sample["temperature_c"] = None
    done = ingest.ingest([ingest.Tick(host.pk, host.created_at.timestamp(), time.time(), message)])
    (values,) = done.live.values()
    assert values["utilization_percent"] == 41.3
    assert values["power_w"] == 301.2
    assert values["temperature_c"] is None
    # The store keeps the sample as the agent sent it.
    (latest,) = selectors.latest_telemetry([int(k) for k in done.live]).values()
    assert latest["sample"]["utilization_gpu_percent"] == 41.26


def test_a_uuid_the_map_does_not_know_is_fetched_again_after_adoption(
    django_capture_on_commit_callbacks,
):
    host, _ = host_create(name="late")
    host = Host.objects.get(pk=host.pk)
    agent = SimAgent(["a30-24gb"], seed=5)
    tick = ingest.Tick(host.pk, host.created_at.timestamp(), time.time(), agent.telemetry())
    assert ingest.ingest([tick]).samples == 0  # not adopted yet: nothing known
    with django_capture_on_commit_callbacks(execute=True):
        gpus_adopt(host=host, gpus=agent.hello()["gpus"])  # forgets the host's map on commit
    assert ingest.ingest([tick]).samples == 1


def test_mig_instances_map_to_their_partitions():
    from fleet.partitioning.models import Partition

    host, _ = host_create(name="mig")
    host = Host.objects.get(pk=host.pk)
    agent = SimAgent(["a30-24gb"], seed=9)
    uuid = agent.backend.list_gpus()[0].uuid
    agent.backend.set_mig_mode(uuid, True)
    instance = agent.backend.create_gpu_instance(uuid, 14, 0)  # 1g.6gb
    agent.backend.create_compute_instance(uuid, instance.gpu_instance_id)
    gpus_adopt(host=host, gpus=agent.hello()["gpus"])
    (partition,) = Partition.objects.filter(kind="mig")
    tick = ingest.Tick(host.pk, host.created_at.timestamp(), time.time(), agent.telemetry())
    (values,) = ingest.ingest([tick]).live.values()
    assert list(values["partitions"]) == [str(partition.pk)]


def test_workload_reports_have_their_own_budget_beside_acks_and_events():
    from fleet.agents.guard import AgentGuard, Refused

    guard = AgentGuard()
    report = {"type": "workloads", "ts": 1.0, "full": False, "workloads": []}
    for _ in range(100):  # a burst of coalesced reports fits
        guard.check_rate(report, now=0.0)  # type: ignore[arg-type]
    with pytest.raises(Refused):
        guard.check_rate(report, now=0.0)  # type: ignore[arg-type]
    # The control budget (acks, events) is untouched by them.
    ack = {"type": "ack", "generation": 1, "status": "applied", "items": [], "observed": []}
    guard.check_rate(ack, now=0.0)  # type: ignore[arg-type]
