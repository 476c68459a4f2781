"""Autoscaling: deployments follow their traffic (target tracking), and scale in where it frees
the most GPU."""
