"""``bench_fairshare``: its arguments are checked, teams are assigned by the documented rule, the
trace is scaled to the load asked, and a small run keeps the sharing rules: under hard caps no
team ever passes its deserved share and nothing is reclaimed; with borrowing, the idle team's
share is used, and the JSON carries what the issue asks for."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.mig import product_by_key
from fleet.placement import MigRequest, rank
from fleet.placement.benchmarks.fairshare import (
    FairshareOptions,
    Job,
    Pod,
    Simulation,
    load_pods,
    team_of,
)
from fleet.placement.benchmarks.trace import TracePod

# A simulation on the product's pure rules: no database, no Redis (once, in `make test`).
pytestmark = pytest.mark.pure

TRACE = (
    Path(__file__).resolve().parents[2]
    / ".."
    / "shared"
    / "data"
    / "alibaba-gpu-v2023"
    / "csv"
    / "openb_pod_list_default.csv"
)
_H100 = product_by_key("h100-sxm5-80gb")
assert _H100 is not None
H100 = _H100


@pytest.mark.parametrize(
    "args",
    [
        ["--gpus", "4"],
        ["--gpus", "9000"],
        ["--window", "10"],
        ["--load", "0"],
        ["--wit-every", "1"],
    ],
)
def test_out_of_range_arguments_are_refused(args):
    with pytest.raises(CommandError):
        call_command("bench_fairshare", *args)


def test_a_missing_trace_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        call_command("bench_fairshare", "--pods", str(tmp_path / "none.csv"))


def test_teams_follow_the_hash_rule_in_proportion_to_their_shares():
    shares = (0.5, 0.3, 0.2)
    names = [f"pod-{n}" for n in range(20_000)]
    counts = [0, 0, 0]
    for name in names:
        counts[team_of(name, shares)] += 1
    assert team_of("pod-7", shares) == team_of("pod-7", shares)  # a rule, not a draw
    for count, share in zip(counts, shares, strict=True):
        assert abs(count / len(names) - share) < 0.02


def pods(n=400):
    """A synthetic trace: sharing and whole-GPU pods arriving over 10,000 s."""
    out = []
    for i in range(n):
        milli = (250, 500, 1000)[i % 3]
        out.append(
            TracePod(f"p{i}", 1000, 1024, 1, milli, (), i * 25, i * 25 + 600 + (i % 7) * 300)
        )
    return out


def test_the_trace_is_scaled_to_the_load_asked():
    options = FairshareOptions(gpus=16, window_s=1200, load=1.2)
    replicas, scaling = load_pods(pods(), H100, options)
    assert scaling["offered_load"] == pytest.approx(1.2, abs=0.01)
    assert max(r.arrival_s for r in replicas) <= 1200
    assert all(0 < r.life_s <= 1200 for r in replicas)


def test_a_small_run_keeps_the_sharing_rules():
    options = FairshareOptions(gpus=32, window_s=1800, load=1.4)
    replicas, _ = load_pods(pods(600), H100, options)
    hard = Simulation(H100, replicas, options, "hard_caps")
    hard.simulate()
    capacity = hard.capacity
    for _, _, used in hard.run.samples:  # nobody past its deserved share, ever
        assert all(u <= d for u, d in zip(used, hard.deserved, strict=True))
    assert hard.run.reclaims == hard.run.moved == hard.run.stopped == 0
    fair = Simulation(H100, replicas, options, "fair_share")
    fair.simulate()
    assert all(occ <= capacity for _, occ, _ in fair.run.samples)
    report_hard, report_fair = hard.report(), fair.report()
    idle = 1  # the second phase: team A idle, the others borrow its share
    assert report_hard["phases"][idle]["share_of_fleet"][0] == 0
    assert (
        report_fair["phases"][idle]["allocation_ratio"]
        > report_hard["phases"][idle]["allocation_ratio"]
    )
    assert any(s > 1.0 for s in report_fair["phases"][idle]["share_over_deserved"][1:])


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared data folder (../shared/data) is absent")
def test_the_command_writes_the_json_the_issue_asks_for(tmp_path):
    out = tmp_path / "fairshare.json"
    call_command(
        "bench_fairshare",
        "--gpus",
        "64",
        "--window",
        "900",
        "--json",
        str(out),
        stdout=io.StringIO(),
    )
    result = json.loads(out.read_text())
    assert {"allocation_ratio"} <= set(result["hard_caps"])
    fair = result["fair_share"]
    assert {"allocation_ratio", "reclaim_p99_s", "stopped_while_free"} <= set(fair)
    assert {"wit_p95_ms", "wit_success"} <= set(fair)
    assert {"replicas", "p95_s", "p99_s"} <= set(fair["returning_by_holdings"])
    assert fair["returning_by_holdings"]["replicas"] >= fair["returning_team_replicas"]
    assert set(fair["reclaim_plan_ms"]) == {"p50", "p95", "max"}
    assert result["fleet"]["gpus"] == 64 and result["trace"]["replicas"] > 1000
    assert set(result["goals"]) >= {"allocation_gain_pp", "reclaim_p99_s", "stopped_while_free"}


def fair_sim(gpus: int = 32) -> tuple[Simulation, list[Pod]]:
    """A borrow-and-reclaim simulation of ``gpus`` H100s, not started, and its trace's
    replicas (the first 600 pods)."""
    options = FairshareOptions(gpus=gpus, window_s=1800, load=1.4)
    replicas, _ = load_pods(pods(600), H100, options)
    return Simulation(H100, replicas, options, "fair_share"), replicas


def start(sim: Simulation, pod: Pod, name: str, at: float = 0.0) -> Job:
    """A replica of ``pod`` renamed ``name``, running from ``at`` on the engine's target."""
    job = Job(replace(pod, name=name), at, 1e6)
    sim.jobs_by_name[name] = job
    best = rank(sim.snapshot, MigRequest(pod.profile_id)).best
    assert best is not None
    sim._start(job, best, False, at, "arrival")
    return job


def test_a_replica_past_its_teams_queue_is_not_entitled_at_arrival():
    # Team A deserves 30 % of 32 GPUs' compute slices; it holds nothing. A first whole-GPU
    # replica is within the share; with 9 GPUs' worth of A's replicas already waiting before
    # it, the next one is past it, though A holds nothing yet.
    sim, replicas = fair_sim()
    whole = next(p for p in replicas if p.team == 0 and p.slices == 7)
    job = Job(whole, 0.0, whole.life_s)
    assert sim._entitled(job) and sim._entitled(job, queued=True)
    sim.waiting_slices[0] = 9 * 7
    assert sim._entitled(job) and not sim._entitled(job, queued=True)


def test_what_would_it_take_offers_no_stop_past_the_share_its_teams_queue_ahead_claims():
    # Team A deserves 30 % of 32 GPUs' compute slices (67.2): nine whole GPUs. With nine of
    # A's whole-GPU replicas waiting before it (and one of team B's, which does not count), a
    # tenth is entitled alone but not once the sweep has served those nine first: the stop plan
    # (the reclaim) is not offered it, as fleet.sharing.wit.Context.entitled_in_turn does.
    sim, replicas = fair_sim()
    whole = [p for p in replicas if p.team == 0 and p.slices == 7][:10]
    other = next(p for p in replicas if p.team == 1 and p.slices == 7)
    jobs = [Job(p, float(i), p.life_s) for i, p in enumerate(whole)]
    for job in [*jobs[:5], Job(other, 5.5, other.life_s), *jobs[5:]]:
        sim._enqueue(job)
    last = jobs[-1]
    assert sim._claimed_before(jobs[0]) == 0
    assert sim._claimed_before(last) == 9 * 7
    assert sim._entitled(last) and not sim._entitled(last, ahead=sim._claimed_before(last))
    assert sim._entitled(jobs[8], ahead=sim._claimed_before(jobs[8]))


def test_a_replica_what_would_it_take_finds_fitting_is_placed_at_once_not_a_second_later():
    # The queue was kicked a moment ago (its once-a-second hold is on): the refresh's first
    # replica that fits has the queue run at once, as fleet.sharing.wit.wit_refresh does.
    sim, replicas = fair_sim()
    whole = next(p for p in replicas if p.team == 0 and p.slices == 7)
    job = Job(whole, 0.0, whole.life_s)
    sim.jobs_by_name[whole.name] = job
    sim._enqueue(job)
    sim.now = sim.kicked_at = 100.0
    sim._wit_sample()
    assert sim.run.wit_kinds == {"place": 1}
    assert job.partition is not None and job.placed_by == "queue" and job.placed_at == 100.0


def test_a_failed_application_names_what_took_the_room_its_plan_named():
    sim, replicas = fair_sim(gpus=8)
    mine, theirs = [p for p in replicas if p.slices == 7][:2]
    job = Job(mine, 0.0, mine.life_s)
    sim._enqueue(job)
    for gpu in range(7):  # all but one GPU taken
        start(sim, theirs, f"filler-{gpu}")
    answer = sim._wit(job)
    assert answer[0].kind == "place" and answer[1] is not None
    sim.now = 3.0
    start(sim, theirs, "taker", 3.0)  # an arrival takes the last GPU meanwhile
    sim._wit_apply(job, answer, 1.0)
    assert sim.run.wit_outcomes == {"place:no_room": 1}
    (failure,) = sim.run.wit_failures
    assert failure["pod"] == mine.name and failure["gpu"] == answer[1].gpu_id
    assert failure["taken_since_by"] == [
        {"pod": "taker", "team": theirs.team, "by": "arrival", "gpu": answer[1].gpu_id}
    ]


def test_what_would_it_take_judges_borrowing_after_the_queues_replicas_ahead():
    # 8 GPUs (56 slices): team B holds 3 whole GPUs, team C 2, both past their deserved
    # shares; team A's deserved share waits for 14 slices. One whole-GPU replica of B and one
    # of C wait, both borrowing. Alone, each may borrow (21 free - 7 covers A's 14); once the
    # queue has placed the first, the second may not (14 - 7 < 14). The second is not told it
    # will be placed, and the queue's run indeed leaves it waiting.
    sim, replicas = fair_sim(gpus=8)
    whole = {t: [p for p in replicas if p.team == t and p.slices == 7] for t in (1, 2)}
    for n in range(3):
        start(sim, whole[1][n], f"b-{n}")
    for n in range(2):
        start(sim, whole[2][n], f"c-{n}")
    sim.waiting_slices[0] = 14
    for t, at in ((1, 1.0), (2, 2.0)):
        job = Job(whole[t][-1], at, 1e6)
        sim.jobs_by_name[job.pod.name] = job
        sim._enqueue(job)
    first, second = sim._queue()
    assert sim._verdict(first).allowed and sim._verdict(second).allowed  # each alone
    assert sim._wit(first)[0].kind == "place"
    assert sim._wit(second)[0].kind == "quota"  # its borrowing is refused once first is in
    _, gained, _ = sim._served_before(second)
    assert gained[first.pod.team] == 7 and not sim._verdict(second, gained).allowed
    sim._place_queue()
    assert first.partition is not None and second.partition is None


def test_an_answer_carried_out_then_undone_by_a_reclaim_is_not_a_failed_application():
    # "It fits now": the queue run the answer triggers places it; 0.4 s later a reclaim for
    # a team that arrived since stops it (it borrowed, and started last). At apply time it
    # waits again: the plan did place it, so this is no failed application; it is listed.
    sim, replicas = fair_sim(gpus=8)
    mine = next(p for p in replicas if p.slices == 7)
    job = Job(mine, 0.0, mine.life_s)
    sim.jobs_by_name[mine.name] = job
    sim._enqueue(job)
    sim.now = 100.0
    answer = sim._wit(job)
    assert answer[0].kind == "place" and answer[1] is not None
    sim._start(job, answer[1], True, 100.0, "queue")
    sim.now = 100.4
    sim._stop(job, 100.4, gone=False)  # as a reclaim does: back to the queue
    sim.now = 105.0
    sim._wit_apply(job, answer, 100.0)
    assert sim.run.wit_applied == 0 and sim.run.wit_failures == []
    (undone,) = sim.run.wit_placed_then_stopped
    assert undone["pod"] == mine.name and undone["placed_by"] == "queue"


def fragmented_sim(queue_defrag: bool = True) -> tuple[Simulation, Job, Job]:
    """8 GPUs: GPUs 0 and 1 each hold one small replica (the smallest), the others a
    whole-GPU one; two whole-GPU replicas wait (``head`` first): neither fits, one move would
    place one."""
    sim, replicas = fair_sim(gpus=8)
    sim.options = replace(sim.options, queue_defrag=queue_defrag)
    small = min(replicas, key=lambda p: p.slices)
    whole = [p for p in replicas if p.slices == 7]
    for gpu in (0, 1):
        job = Job(replace(small, name=f"small-{gpu}"), 0.0, 1e6)
        sim.jobs_by_name[job.pod.name] = job
        feasible = rank(sim.snapshot, MigRequest(small.profile_id)).feasible
        sim._start(job, next(t for t in feasible if t.gpu_id == gpu), False, 0.0, "arrival")
    for n in range(6):
        start(sim, whole[n], f"whole-{n}")
    head, behind = (Job(replace(whole[6 + i], name=f"queued-{i}"), float(i), 1e6) for i in (0, 1))
    for job in (head, behind):
        sim.jobs_by_name[job.pod.name] = job
        sim._enqueue(job)
    sim.now = 100.0
    return sim, head, behind


def test_the_engine_carries_out_the_queues_heads_moves_and_the_next_is_answered_after_them():
    # FLEET_QUEUE_DEFRAG, as fleet.sharing.wit.wit_refresh does: the head's moves answer is
    # carried out (its move, then it is placed); the replica behind is answered on the fleet
    # after them, where no move makes room: it is not given the same plan.
    sim, head, behind = fragmented_sim()
    assert sim._queue() == [head, behind]
    sim._wit_sample()
    assert head.placed_by == "defrag" and head.placed_s == 100.0 + sim.options.move_s
    assert behind.partition is None
    assert (sim.run.defrags, sim.run.defrag_moved, sim.run.moved) == (1, 1, 0)
    assert sim.run.wit_kinds == {"moves": 1, "wait": 1}
    assert sim.report()["queue_defrags"] == {"started": 1, "failed": 0, "moved": 1}


def test_reclaims_keep_away_from_the_gpus_of_the_running_defrag():
    # As fleet.allocations.reclaims.running_reclaims: while the head's defrag runs, its GPUs
    # (the moved replica's source and destination, where the head goes) are busy for reclaims.
    sim, head, _ = fragmented_sim()
    sim._wit_sample()
    assert head.placed_by == "defrag" and head.gpu is not None
    assert head.gpu in sim._busy() and len(sim.defrag_gpus) == 2
    sim.now = sim.defrag_until
    assert sim._busy() == set()


def test_without_the_engines_defrag_the_one_move_is_promised_to_the_head_alone():
    # Nobody carries the head's moves out, yet the replica behind is answered on the fleet
    # after them (fleet.sharing.wit.QueueWalk's promise): not told to apply the same move.
    sim, head, behind = fragmented_sim(queue_defrag=False)
    sim._wit_sample()
    assert head.partition is None and behind.partition is None
    assert sim.run.wit_kinds == {"moves": 1, "wait": 1} and sim.run.defrags == 0


def test_a_quota_answer_counts_what_the_queue_places_behind_it_before_the_change():
    # 8 GPUs, 7 held: team A waits for 5 slices, so team B may not borrow a whole GPU (7 of
    # the 7 free) but may borrow two slices. B's whole-GPU replica waits first, a 2-slice one
    # behind: the queue passes over the first and places the second on the last GPU before an
    # admin's change could land, so no quota change places the first (it was told "quota").
    sim, replicas = fair_sim(gpus=8)
    whole = [p for p in replicas if p.team == 1 and p.slices == 7]
    small = next(p for p in replicas if p.team == 1 and p.slices == 2)
    for n in range(7):
        start(sim, whole[n], f"b-{n}")
    sim.waiting_slices[0] = 5
    first, behind = Job(whole[7], 1.0, 1e6), Job(small, 2.0, 1e6)
    for job in (first, behind):
        sim.jobs_by_name[job.pod.name] = job
        sim._enqueue(job)
    assert sim._queue() == [first, behind]
    assert not sim._verdict(first).allowed and sim._verdict(behind).allowed
    assert sim._wit(first)[0].kind == "wait"
    sim._place_queue()
    assert behind.partition is not None and first.partition is None


def test_a_quota_answer_is_promised_the_room_its_teams_replicas_ahead_leave():
    # 8 GPUs: team B holds 4 whole GPUs, team C 3; team A's deserved share waits for 17
    # slices, so B may not borrow the last GPU. Two whole-GPU replicas of B wait. A quota
    # change lets both in, the first placed first: it is told "quota", the second, with no
    # room left after it, is not (both were told "quota" of the one GPU before).
    sim, replicas = fair_sim(gpus=8)
    whole = {t: [p for p in replicas if p.team == t and p.slices == 7] for t in (1, 2)}
    for n in range(4):
        start(sim, whole[1][n], f"b-{n}")
    for n in range(3):
        start(sim, whole[2][n], f"c-{n}")
    sim.waiting_slices[0] = 17
    queued = []
    for n, at in ((4, 1.0), (5, 2.0)):
        job = Job(whole[1][n], at, 1e6)
        sim.jobs_by_name[job.pod.name] = job
        sim._enqueue(job)
        queued.append(job)
    first, second = queued
    assert sim._queue() == queued and not sim._verdict(first).allowed
    assert sim._wit(first)[0].kind == "quota"
    assert sim._wit(second)[0].kind == "wait"
