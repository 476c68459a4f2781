"""Long-running work, as NetBox's ``JobRunner`` runs jobs: each kind is a workflow that declares
its steps, deadline and compensation (:mod:`fleet.workflows.engine`); one registry says what
wakes each kind (:mod:`fleet.workflows.registry`). The floor above ``allocations``: a workflow
calls the services below it, and nothing below imports a workflow."""
