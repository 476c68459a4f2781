"""Fleet: an open-source control plane for sharing NVIDIA GPUs across a fleet of hosts."""
