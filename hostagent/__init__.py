"""Fleet host agent: discovers GPUs with NVML, reports telemetry and applies MIG/MPS layouts.

The agent never imports Django or the control plane; :mod:`hostagent.protocol` is the contract.
"""

__version__ = "0.1.0"
