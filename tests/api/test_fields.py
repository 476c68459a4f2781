"""Bounded request fields: an over-long list or map is refused before any of its items is
validated, and every list and map a request body takes says its bound in the schema."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from fleet.api.fields import BoundedDictField, BoundedListField
from tests.helpers import assert_error


class CountingField(serializers.IntegerField):
    """An item field that counts how often it was asked to validate."""

    calls = 0

    def to_internal_value(self, data: Any) -> int:
        type(self).calls += 1
        return int(super().to_internal_value(data))


@pytest.fixture
def counting() -> type[CountingField]:
    CountingField.calls = 0
    return CountingField


def test_an_over_long_list_is_refused_before_any_item_is_validated(counting):
    field = BoundedListField(child=counting(), max_length=16)
    with pytest.raises(serializers.ValidationError) as refused:
        field.run_validation(list(range(20_000)))
    assert refused.value.detail == ["Ensure this field has no more than 16 elements."]
    assert counting.calls == 0
    assert field.run_validation(list(range(16))) == list(range(16))
    assert counting.calls == 16


def test_an_over_large_map_is_refused_before_any_value_is_validated(counting):
    field = BoundedDictField(child=counting(), max_entries=64)
    with pytest.raises(serializers.ValidationError) as refused:
        field.run_validation({f"k{i}": i for i in range(20_000)})
    assert refused.value.detail == ["Ensure this field has no more than 64 keys."]
    assert counting.calls == 0
    assert field.run_validation({"a": 1}) == {"a": 1}


def test_a_list_field_without_a_bound_is_a_programming_error():
    with pytest.raises(TypeError, match="max_length"):
        BoundedListField(child=serializers.IntegerField())


@pytest.mark.django_db
def test_validating_20000_mig_instances_is_refused_as_too_many(viewer_client):
    instances = [{"profile": 19, "start": 0}] * 20_000
    response = viewer_client.post(
        "/api/v1/mig/validate", {"product": "h100-sxm5-80gb", "instances": instances}, format="json"
    )
    body = assert_error(response, 400, "invalid")
    assert "no more than 16" in str(body["details"])


def _request_schemas(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {})
            for media in body.values():
                out.append((f"{method.upper()} {path}", media["schema"]))
    return out


def _unbounded(
    schema: dict[str, Any], components: dict[str, Any], where: str, seen: set[str]
) -> list[str]:
    """The lists and maps in ``schema`` (and what it refers to) without a maximum size."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        seen.add(name)
        return _unbounded(components[name], components, f"{where} > {name}", seen)
    found = []
    if schema.get("readOnly"):
        return []
    if schema.get("type") == "array":
        if "maxItems" not in schema:
            found.append(where)
        found += _unbounded(schema.get("items", {}), components, f"{where}[]", seen)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and schema.get("type") == "object":
        if "maxProperties" not in schema:
            found.append(where)
        found += _unbounded(extra, components, f"{where}{{}}", seen)
    for name, prop in schema.get("properties", {}).items():
        found += _unbounded(prop, components, f"{where}.{name}", seen)
    for key in ("allOf", "oneOf", "anyOf"):
        for part in schema.get(key, ()):
            found += _unbounded(part, components, where, seen)
    return found


@pytest.mark.django_db
def test_every_list_and_map_a_request_body_takes_has_a_maximum_size(viewer_client):
    schema = viewer_client.get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]
    requests = _request_schemas(schema)
    assert len(requests) > 20
    unbounded = [
        found for where, body in requests for found in _unbounded(body, components, where, set())
    ]
    assert unbounded == []
