"""The deployment page's autoscaling chart (issue 24): every evaluation leaves a point (replicas,
the metric per ready replica), the decisions are drawn from their operations even when the cache
lost the points, and the geometry puts the replicas on steps and the target on its level."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from fleet.autoscaling.history import (
    HEIGHT,
    WIDTH,
    Point,
    history_chart,
    history_of,
    history_record,
)
from fleet.autoscaling.models import ScalingPolicy
from fleet.autoscaling.policy import autoscaling_set
from fleet.autoscaling.presenters import autoscaling_chart, autoscaling_panel
from fleet.autoscaling.services import autoscale_evaluate
from tests.autoscaling.test_services import POLICY, _deployment, _traffic, gpus  # noqa: F401


def test_the_geometry_steps_the_replicas_and_levels_the_target() -> None:
    now = 10_000.0
    points = [Point(now - 600, 2, 3.0), Point(now - 300, 5, None), Point(now - 60, 4, 4.5)]
    chart = history_chart(points, target=4.0, most=8, now=now)
    assert chart.has_data and chart.latest_replicas == 4 and chart.replicas_max == 8
    # From the first point to now: x 0 at the first point, steps (H then V), to the right edge.
    assert chart.replicas_path.startswith("M0.0,")
    assert " H" in chart.replicas_path and " V" in chart.replicas_path
    assert chart.replicas_path.endswith(f"H{WIDTH}")
    # Scale: max(2 x target, 1.1 x the largest value) = 8; the target at half the height.
    assert chart.value_max == 8.0
    assert chart.target_y == HEIGHT / 2
    # A point with no value breaks the line: two moves.
    assert chart.value_path.count("M") == 2 and "L" not in chart.value_path
    assert chart.minutes == 10
    empty = history_chart([], target=4.0, most=8, now=now)
    assert not empty.has_data and empty.replicas_path == "" and empty.latest_replicas is None


@pytest.mark.django_db
def test_each_evaluation_is_a_point_and_the_decisions_survive_the_cache(gpus):  # noqa: F811
    cache.clear()
    deployment = _deployment([gpus[0], gpus[0]])
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    _traffic(deployment, 8.0)  # 4 per ready replica: on the target
    autoscale_evaluate(deployment_id=deployment.pk)
    _traffic(deployment, 20.0)  # 10 per ready replica: out to 5
    autoscale_evaluate(deployment_id=deployment.pk)
    points = history_of(deployment.pk)
    # Two evaluations, and the scale-out's operation (before and after the step).
    assert [(p.replicas, p.value) for p in points if p.replicas == 2][:1] == [(2, 4.0)]
    assert (5, 10.0) in [(p.replicas, p.value) for p in points]
    assert len(points) == 4
    cache.clear()
    kept = history_of(deployment.pk)
    assert [(p.replicas, p.value) for p in kept] == [(2, 10.0), (5, 10.0)]
    deployment.refresh_from_db()
    chart = autoscaling_chart(deployment, autoscaling_panel(deployment))
    assert chart is not None and chart.latest_replicas == 5 and chart.has_data


@pytest.mark.django_db
def test_a_quiet_reading_after_a_burst_does_not_scale_in_below_what_the_burst_wanted(gpus):  # noqa: F811
    cache.clear()
    deployment = _deployment(gpus)  # 3 ready replicas
    autoscaling_set(deployment_id=deployment.pk, spec=POLICY)
    now = timezone.now()
    # Set an hour ago: its own scale-in cooldown from creation is long past.
    ScalingPolicy.objects.filter(pk=deployment.pk).update(created_at=now - timedelta(hours=1))
    # The burst's evaluation wanted 3 replicas; then a quiet reading, within the scale-in window.
    history_record(
        deployment_id=deployment.pk, at=now.timestamp(), replicas=3, ready=3, value=4, desired=3
    )
    _traffic(deployment, 0.5)
    decision = autoscale_evaluate(deployment_id=deployment.pk, now=now + timedelta(seconds=10))
    assert decision is not None and decision.action == "hold"
    assert "stabilization" in decision.reason
    # Past the window (300 s), the quiet readings alone decide: 1 replica.
    decision = autoscale_evaluate(deployment_id=deployment.pk, now=now + timedelta(seconds=320))
    assert decision is not None and (decision.action, decision.replicas) == ("in", 1)
