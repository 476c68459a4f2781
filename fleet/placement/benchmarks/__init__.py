"""Benchmarks of the placement engine on the Alibaba GPU traces (``../shared/data``).

Pure, like the engine: the callers read the CSV files and pass rows in. :mod:`.bench` replays
the traces under the published FGD protocol (our re-implementations of FGD and the baselines in
:mod:`.policies`, :mod:`.fragaware`, :mod:`.frag` and :mod:`.cluster`; the product engine through
:func:`fleet.placement.rank` in :mod:`.product`); :mod:`.migbench` and :mod:`.migchurn` their MIG
variants; :mod:`.decisions` times ``rank`` on a synthetic fleet.
"""
