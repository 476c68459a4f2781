"""GPU backends: the :class:`~hostagent.gpu.backend.GpuBackend` seam, NVML and simulated."""
