"""Fleet host agent: discovers GPUs with NVML, reports telemetry, applies MIG/MPS layouts and runs
the workloads placed on its slices (:mod:`hostagent.runtime`).

The agent never imports Django or the control plane; :mod:`hostagent.protocol` is the contract.
"""

__version__ = "0.2.0"
