"""The teams migration: deployments that existed before teams join the ``default`` team."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("allocations", "0008_replica_samples"), ("core", "0009_operation_kind_layout_rollout")]
AFTER = [("allocations", "0009_deployment_team")]


def test_existing_deployments_join_the_default_team():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    old.get_model("allocations", "Deployment").objects.create(
        name="legacy", kind="gpu", gpu_count=1, replicas=1
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    deployment = new.get_model("allocations", "Deployment").objects.get(name="legacy")
    assert deployment.team.slug == "default" and deployment.team.name == "default"
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
