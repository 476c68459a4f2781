"""Repack: the moves that empty ``count`` whole GPUs of one product, moving the fewest replicas.

An exact model solved by OR-Tools CP-SAT (imported lazily; a time limit bounds it), with the
greedy :func:`fleet.placement.defrag.plan_free_gpus` as the fallback when ortools is missing, the
model is too big, or the solver finds no plan in time. The model:

* ``empty[s]``: GPU ``s`` of the product is emptied; exactly ``count`` are. A GPU is a candidate
  when it holds something and every replica on it can move (a multi-GPU replica, or MPS clients
  inside a MIG instance, pin it: it is listed in ``unmovable`` with the reason).
* ``move[r, g]``: replica ``r`` of an emptied GPU lands on GPU ``g``; exactly one ``g`` when its
  GPU is emptied, none otherwise, and never a GPU being emptied. A pair exists only when
  :func:`fleet.placement.check` accepts ``r`` on ``g`` as it is now (health, cordons, host
  runtime and labels, the replica's products, MIG placements, MPS caps), so each rule of one
  replica on one GPU is the engine's own.
* What several arrivals share on one GPU: an MPS daemon's free memory and client slots (the
  compute cap is per client, never summed: ECS); a free dedicated GPU takes one whole-GPU
  replica; a MIG GPU takes one of the maximal multisets of arriving profiles that fit beside
  what stays (idle instances of a profile reused first, new ones by
  :func:`fleet.mig.suggest_layout`).
* Cost: the replicas moved (idle MIG instances on an emptied GPU are destroyed for free).

An idle GPU (nothing placed, whatever its mode and idle MIG instances) of the product is already
free: it is not emptied and never receives a replica (that would undo a GPU freed); idle GPUs of
other products may receive. MPS clients go only to whole-GPU MPS daemons in this model. Every
plan, from either method, is replayed move by move with :func:`fleet.placement.check` on the
snapshot before it is returned, with the MIG starts it names, so an applied plan keeps every
rule.
``bound`` is a proven lower bound on the cost: with CP-SAT, the solver's bound over its model
(which lands MPS clients on whole-GPU daemons only) and never below the sum of the ``count``
cheapest candidates, the bound reported with the greedy plan (valid for any plan). When the
greedy plan moves fewer replicas than CP-SAT found in time, the greedy plan is returned, so a
plan is never worse than the greedy one. On a large fleet the model holds only the
``count + MODEL_SLACK`` cheapest candidates (then the bound is the cheap one).

The package: :mod:`.values` (the plan and the replicas it moves), :mod:`.problem` (one product's
candidates, the greedy plan, and the answer), :mod:`.solver` (:func:`~.solver.plan_repack`: the
CP-SAT model) and :mod:`.replay` (a solution's moves, checked one by one).
"""
