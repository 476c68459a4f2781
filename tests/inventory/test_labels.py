"""Host labels are bounded the same way wherever they are written: the API, the services and the
admin's form."""

from __future__ import annotations

import pytest

from fleet.core.errors import ServiceError
from fleet.inventory.admin import HostAdminForm
from fleet.inventory.labels import labels_checked, labels_problems
from fleet.inventory.services import host_create


@pytest.mark.parametrize(
    "labels",
    [
        {},
        {"zone": "a"},
        {"example.com/rack": "r7", "gpu.type": "H100 SXM5", "a": ""},
        {f"k{i}": "v" * 63 for i in range(32)},
    ],
)
def test_valid_labels_have_no_problem(labels):
    assert labels_problems(labels) == []
    assert labels_checked(labels) == labels


@pytest.mark.parametrize(
    "labels",
    [
        [],
        {f"k{i}": "v" for i in range(33)},
        {"k" * 64: "v"},
        {"zone": "v" * 64},
        {"zone_": "a"},
        {"Example.com/zone": "a"},
        {"": "a"},
        {"zone": None},
        {"zone": "tab\there"},
    ],
)
def test_invalid_labels_are_refused_with_every_problem(labels):
    assert labels_problems(labels)
    with pytest.raises(ServiceError) as refused:
        labels_checked(labels)
    assert refused.value.code == "labels.invalid"
    assert refused.value.details["problems"]


@pytest.mark.django_db
def test_a_host_is_not_created_with_invalid_labels():
    with pytest.raises(ServiceError):
        host_create(name="gpu-a", labels={"-bad": "x"})


@pytest.mark.django_db
def test_the_admin_form_refuses_invalid_labels():
    form = HostAdminForm(
        data={"name": "gpu-a", "labels": '{"k": "' + "v" * 64 + '"}', "status": "ready"}
    )
    assert not form.is_valid()
    assert "labels" in form.errors
