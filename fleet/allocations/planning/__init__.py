"""What the fleet could do with its GPUs: the capacity report (:mod:`.capacity`), the layout
advice for waiting replicas (:mod:`.advice`) and the repack plans (:mod:`.repack_plans`), each
a read of the rows handed to the pure placement engine.

Nothing else in ``fleet.allocations`` imports it; the workflows that apply a plan sit above.
"""
