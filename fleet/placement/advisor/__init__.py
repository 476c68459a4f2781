"""The layout advisor: MIG layouts for a product's GPUs that place the most waiting replicas
while moving the fewest running ones (CP-SAT, with a time limit).

The model, per GPU, is one boolean per allowed placement of each useful profile (the product's
own NVML placements, so starts, sizes, overlaps, the per-GPU and per-profile instance counts and
the media-extension rules are exactly :mod:`fleet.mig.rules`). Existing busy instances stay where
they are unless their GPU is *drained*; a drained GPU's running replicas all count as moves (a
rollout drains a whole GPU, :mod:`fleet.allocations.drain`), and they need instances of their
profile somewhere in the new layouts. Waiting MIG replicas need an instance of their profile; a
waiting MPS replica can run in a new MIG instance with its own MPS daemon (MPS inside MIG), one
deployment per such instance, as many clients as its memory and the instance's client slots
allow (:meth:`fleet.mps.MpsDevice.mig_instance`).

The objective is lexicographic, folded into one integer: replicas placed first, then the fewest
replicas moved, then the fewest idle instances destroyed and spare instances created.

OR-Tools is imported lazily; without it :func:`~.solver.advise` answers with the greedy plan
(keep every instance, add the waiting replicas where they fit), status ``heuristic``.

The package: :mod:`.values` (the advisor's input and answer), :mod:`.problem` (the problem, its
greedy plan and the answer's assembly), :mod:`.solver` (:func:`~.solver.advise`: CP-SAT on the
problem) and :mod:`.groups` (:func:`~.groups.advise_groups`: waiting replicas that may use only
some of the GPUs).
"""
