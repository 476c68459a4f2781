"""Endpoints: each deployment answers at one address, through a real load balancer (HAProxy)
that a Fleet gateway keeps in step with the deployment's ready copies."""
