"""Evaluating the policies (beat, every ``FLEET_AUTOSCALE_SECONDS``) and acting on them.

Each evaluation locks the deployment row (as every write on its replicas does), reads its ready
replicas and its metric, asks :func:`fleet.autoscaling.rule.decide`, and acts:

* **scale-out**: the team's quota is asked first; replicas it would refuse are not added (the
  policy says ``scaling blocked: quota``, an ``autoscale`` operation fails saying which limit).
  The new replicas are placed by the product engine at once; those that fit nowhere wait in the
  tray with the engine's reason (``scaling blocked: capacity``);
* **scale-in** always proceeds: replicas not placed go first, then the placed replicas whose
  removal leaves the fleet least fragmented (:func:`fleet.placement.release.rank_releases`), not
  the newest. Each leaves through the eviction path, so the balancer drains it before its
  workload stops (:mod:`fleet.endpoints.selectors`: a releasing copy is draining). The
  replicas that stay keep consecutive indices: the last ones take the freed numbers.

Every decision that changes the count is an ``autoscale`` operation carrying the metric values
that drove it. A failure evaluating one deployment costs only that deployment.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.allocations.autoplace import deployment_place_all
from fleet.allocations.models import Allocation, AllocationState, Deployment
from fleet.allocations.quotas import sharing_of, team_usage
from fleet.allocations.selectors import fleet_snapshot, placement_request
from fleet.allocations.services import allocations_evict, lock_deployment
from fleet.autoscaling.history import history_record, recent_desired
from fleet.autoscaling.models import ScalingPolicy, ScalingState
from fleet.autoscaling.rule import Decision, Limits, Observation, decide
from fleet.autoscaling.selectors import Replicas, policy_metric, replicas_of
from fleet.core.errors import RuleViolation, ServiceError
from fleet.core.events import publish_changed
from fleet.core.jobs import reclaim_after_commit
from fleet.core.models import Operation, OperationKind, OperationStatus, Team
from fleet.core.operations import operation_record
from fleet.placement.quota import plus, quota_violations, replica_demand
from fleet.placement.release import Candidate, rank_releases

logger = logging.getLogger(__name__)


def autoscale_all(now: datetime | None = None) -> int:
    """Evaluate every policy once; the number of deployments whose count changed."""
    changed = 0
    ids = ScalingPolicy.objects.filter(deployment__deleting=False).values_list("pk", flat=True)
    for deployment_id in list(ids):
        try:
            decision = autoscale_evaluate(deployment_id=deployment_id, now=now)
        except ServiceError as error:  # deleted meanwhile: nothing to scale
            logger.info("autoscaling %s: %s", deployment_id, error.message)
            continue
        except Exception:
            logger.exception("autoscaling %s failed; the next evaluation retries", deployment_id)
            continue
        if decision is not None and decision.action != "hold":
            changed += 1
    return changed


@transaction.atomic
def autoscale_activate(*, slot: int) -> float | None:
    """A request reached the endpoint of backend ``slot`` and found no replica (the gateway's
    activator, :mod:`fleet.endpoints.activator`): a deployment that scales to zero and is at
    zero gets its first replica now, not at the next evaluation. Returns how long the request
    may be held (its policy's ``activation_timeout_s``), or ``None``: the deployment does not
    scale to zero, and the request is answered 503 at once."""
    from fleet.endpoints.models import Endpoint

    endpoint = Endpoint.objects.filter(slot=slot).first()
    if endpoint is None:
        return None
    policy = ScalingPolicy.objects.filter(pk=endpoint.deployment_id, min_replicas=0).first()
    if policy is None:
        return None
    deployment = lock_deployment(endpoint.deployment_id)
    if deployment.replicas == 0:
        policy = ScalingPolicy.objects.select_for_update().get(pk=deployment.pk)
        decision = Decision("out", 1, "a request arrived at zero replicas")
        observed = Observation(replicas=0, ready=0, value=None)
        state, reason = _scale_out(deployment, policy, decision, observed, 0)
        policy.last_scale_out_at = timezone.now()
        policy.state, policy.reason = state, reason[:200]
        policy.save()
        publish_changed("deployment", [deployment.pk])
    return float(policy.activation_timeout_s)


def _limits(policy: ScalingPolicy) -> Limits:
    return Limits(
        min=policy.min_replicas,
        max=policy.max_replicas,
        target=policy.target,
        scale_out_cooldown_s=policy.scale_out_cooldown_s,
        scale_in_cooldown_s=policy.scale_in_cooldown_s,
        max_step_out=getattr(settings, "FLEET_AUTOSCALE_MAX_STEP_OUT", None),
    )


def _since(at: datetime | None, now: datetime) -> float | None:
    return None if at is None else (now - at).total_seconds()


@transaction.atomic
def autoscale_evaluate(*, deployment_id: int, now: datetime | None = None) -> Decision | None:
    """One evaluation of one deployment's policy (``None``: it has none)."""
    now = now or timezone.now()
    deployment = lock_deployment(deployment_id)
    policy = ScalingPolicy.objects.select_for_update().filter(pk=deployment_id).first()
    if policy is None:
        return None
    replicas = replicas_of(deployment)
    metric = policy_metric(deployment, policy, replicas.ready)
    value = metric.value
    observed = Observation(
        replicas=deployment.replicas,
        ready=len(replicas.ready),
        value=value,
        additive=metric.additive,
        since_scale_out_s=_since(policy.last_scale_out_at, now),
        # A new policy's first scale-in waits its cooldown from when it was set: its first
        # reading (no history yet) may come before the traffic reaches its rate.
        since_scale_in_s=_since(policy.last_scale_in_at or policy.created_at, now),
        recent_desired=recent_desired(deployment_id, now.timestamp() - policy.scale_in_cooldown_s),
    )
    decision = decide(_limits(policy), observed)
    state: str = ScalingState.STEADY
    reason = decision.reason
    if decision.action == "out":
        state, reason = _scale_out(deployment, policy, decision, observed, len(replicas.placed))
        policy.last_scale_out_at = now
    elif decision.action == "in":
        _scale_in(deployment, policy, decision, observed, replicas)
        state = ScalingState.SCALING_IN
        policy.last_scale_in_at = now
    elif value is None:
        state = ScalingState.NO_METRIC
        reason = metric.problem or reason
    elif len(replicas.ready) < deployment.replicas:
        state = ScalingState.SCALING_OUT
    policy.state, policy.reason = state, reason[:200]
    policy.value = decision.per_replica
    policy.evaluated_at = now
    policy.save()
    history_record(
        deployment_id=deployment.pk,
        at=now.timestamp(),
        replicas=deployment.replicas,
        ready=len(replicas.ready),
        value=decision.per_replica,
        desired=decision.desired,
    )
    if decision.action != "hold":
        publish_changed("deployment", [deployment.pk])
    return decision


def _payload(
    policy: ScalingPolicy, decision: Decision, observed: Observation, before: int
) -> dict[str, Any]:
    return {
        "metric": policy.metric,
        **({"metric_name": policy.metric_name} if policy.metric_name else {}),
        "target": policy.target,
        "value": observed.value,
        "per_replica": decision.per_replica,
        "ready": observed.ready,
        "from": before,
        "to": decision.replicas,
        "desired": decision.desired,
        "reason": decision.reason,
    }


def _describe(policy: ScalingPolicy, decision: Decision) -> str:
    if decision.per_replica is None:
        return decision.reason
    name = policy.metric_name or policy.metric
    return f"{name} {decision.per_replica:.3g} against a target of {policy.target:g}"


def _quota_room(deployment: Deployment, placed: int, extra: int) -> tuple[int, list[Any]]:
    """How many of ``extra`` new replicas the team's quota leaves room for (replicas already
    waiting to be placed count first), and the limits the next one would pass."""
    team = Team.objects.filter(pk=deployment.team_id).first()
    if team is None or not team.shares_bounded:
        return extra, []
    # Its cap: the limit where one is set (borrowing included), else the deserved share.
    quota, usage = sharing_of(team).cap(), team_usage(team.pk)
    demand = replica_demand(placement_request(deployment))
    waiting = max(0, deployment.replicas - placed)
    room = 0
    for _ in range(waiting + extra):
        violations = quota_violations(quota, usage, demand)
        if violations:
            return max(0, room - waiting), [v.as_dict() for v in violations]
        usage, room = plus(usage, demand), room + 1
    return extra, []


def _scale_out(
    deployment: Deployment,
    policy: ScalingPolicy,
    decision: Decision,
    observed: Observation,
    placed: int,
) -> tuple[str, str]:
    before = deployment.replicas
    wanted = decision.replicas - before
    room, violations = _quota_room(deployment, placed, wanted)
    payload = _payload(policy, decision, observed, before)
    if room <= 0:
        operation_record(
            kind=OperationKind.AUTOSCALE,
            summary=f"Autoscaling {deployment.name} to {decision.replicas} replicas refused by "
            f"its team's quota",
            deployment=deployment,
            status=OperationStatus.FAILED,
            payload={**payload, "to": before, "violations": violations},
            reason="quota.exceeded",
        )
        return ScalingState.BLOCKED_QUOTA, "scaling blocked: quota"
    target = before + room
    Deployment.objects.filter(pk=deployment.pk).update(replicas=target, updated_at=timezone.now())
    deployment.replicas = target
    operation = operation_record(
        kind=OperationKind.AUTOSCALE,
        summary=f"Autoscaled {deployment.name} from {before} to {target} replicas "
        f"({_describe(policy, decision)})",
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        payload={**payload, "to": target, "violations": violations},
    )
    state, reason = ScalingState.SCALING_OUT, decision.reason
    try:
        placed_ops = deployment_place_all(deployment_id=deployment.pk).operations
    except (RuleViolation, ServiceError) as error:
        placed_ops = []
        state, reason = ScalingState.BLOCKED_CAPACITY, f"scaling blocked: {error.message}"
    else:
        if len(placed_ops) < room:
            state, reason = ScalingState.BLOCKED_CAPACITY, "scaling blocked: capacity"
    if state == ScalingState.BLOCKED_CAPACITY:
        reclaim_after_commit()  # its team's deserved share may take capacity back now
    Operation.objects.filter(pk=operation.pk).update(
        payload={**operation.payload, "placed": [op.pk for op in placed_ops]}
    )
    if room < wanted:
        state, reason = ScalingState.BLOCKED_QUOTA, "scaling blocked: quota"
    return state, reason


def _scale_in(
    deployment: Deployment,
    policy: ScalingPolicy,
    decision: Decision,
    observed: Observation,
    replicas: Replicas,
) -> None:
    before, target = deployment.replicas, decision.replicas
    by_index = {a.replica: a for a in replicas.placed}
    unplaced = [i for i in range(before) if i not in by_index and i not in replicas.moving]
    to_remove = before - target
    victims: list[int] = []
    placed_to_remove = max(0, to_remove - len(unplaced))
    if placed_to_remove:
        slots = Allocation.objects.placed().filter(
            deployment=deployment, replica__in=list(by_index), replaces__isnull=True
        )
        gpus: dict[int, list[tuple[int, int]]] = {}
        for row in slots.order_by("replica", "gpu_slot").values_list("replica", "gpu_id", "pk"):
            gpus.setdefault(row[0], []).append((row[1], row[2]))
        ranked = rank_releases(
            fleet_snapshot(),
            [
                Candidate(index, tuple(gpus.get(index, ())))
                for index in sorted(by_index)
                if index not in replicas.moving
            ],
        )
        # A replica being moved goes last: its move is undone by the eviction.
        order = [r.replica for r in ranked] + sorted(replicas.moving & set(by_index))
        victims = order[:placed_to_remove]
    if victims:
        allocations_evict(
            deployment=deployment,
            allocations=Allocation.objects.placed().filter(
                deployment=deployment, replica__in=victims
            ),
        )
    Deployment.objects.filter(pk=deployment.pk).update(replicas=target, updated_at=timezone.now())
    deployment.replicas = target
    renumbered = _renumber(deployment, target)
    operation_record(
        kind=OperationKind.AUTOSCALE,
        summary=f"Autoscaled {deployment.name} from {before} to {target} replicas "
        f"({_describe(policy, decision)})",
        deployment=deployment,
        status=OperationStatus.SUCCEEDED,
        payload={
            **_payload(policy, decision, observed, before),
            "stopped_replicas": sorted(victims),
            "renumbered": renumbered,
        },
    )


def _renumber(deployment: Deployment, count: int) -> dict[str, int]:
    """Give the replicas that stay, numbered ``count`` or above, the free numbers below it
    (every row of a replica: its GPUs, a move's copies); ``{old: new}``."""
    staying = Allocation.objects.filter(deployment=deployment).exclude(
        state=AllocationState.RELEASING
    )
    used = set(staying.values_list("replica", flat=True))
    free = iter(sorted(set(range(count)) - used))
    moved: dict[str, int] = {}
    for old in sorted(i for i in used if i >= count):
        new = next(free, None)
        if new is None:
            break
        staying.filter(Q(replica=old)).update(replica=new)
        moved[str(old)] = new
    return moved
