"""The HAProxy gateway: its configuration (:mod:`.config`), its Runtime API (:mod:`.runtime`)
and the sync that keeps it in step with the fleet (:mod:`.sync`)."""
