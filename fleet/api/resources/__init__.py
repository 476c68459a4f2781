"""The REST API's resources, one package each: ``<resource>/serializers.py`` (what the resource
reads and writes, the bodies of its commands and the answers they render) and
``<resource>/views.py`` (its viewset or views: parse, call a service or a selector, render
through those serializers). A view module defines no serializer.

What they share sits one level up: :mod:`fleet.api.common` (the error envelope and
:func:`~fleet.api.common.error_responses`, the read viewset base, body and id parsing),
:mod:`fleet.api.permissions` (the team checks), :mod:`fleet.api.fields`,
:mod:`fleet.api.filters`, and the plumbing (limits, parsers, schema, negotiation, pagination,
export). The routes are :mod:`fleet.api.urls`."""
