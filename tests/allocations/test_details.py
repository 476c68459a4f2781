"""A deployment's details (``Deployment.DETAIL_FIELDS``): set in place by one service, which
refuses any other field and changes nothing then."""

from __future__ import annotations

import pytest

from fleet.allocations.details import deployment_set_details
from fleet.allocations.models import Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create
from fleet.core.errors import ServiceError

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment() -> Deployment:
    return deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="1g.10gb"), replicas=1
    )


@pytest.mark.parametrize("field", ["name", "replicas", "team", "workload", "nonsense"])
def test_a_field_that_is_not_a_detail_is_refused_and_nothing_changes(deployment, field):
    before = Deployment.objects.values().get(pk=deployment.pk)
    with pytest.raises(ServiceError) as refused:
        deployment_set_details(deployment_id=deployment.pk, details={field: "x"})
    assert refused.value.code == "deployment.field_unknown"
    assert Deployment.objects.values().get(pk=deployment.pk) == before


def test_no_details_change_nothing(deployment):
    before = Deployment.objects.values().get(pk=deployment.pk)
    deployment_set_details(deployment_id=deployment.pk, details={})
    assert Deployment.objects.values().get(pk=deployment.pk) == before
