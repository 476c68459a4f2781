"""``bench_runtime``: how fast the agent runs workloads, on the production stack.

It starts its own stack on loopback (a scratch PostgreSQL database, a private Redis, daphne, a
Celery worker), one real ``fleet-agent`` on the simulated backend with a real runtime (Docker by
default, with a locally built image: no registry is needed), and MIG GPUs cut into 1g slices.
Then, for a deployment of N container replicas:

* **place → running**: each replica is placed alone through the API; the time until the API shows
  its workload ``running`` (the agent applied the desired state, started the container and
  reported it);
* **burst**: N replicas placed at once; replicas started per second until all run;
* **adoption**: the agent is killed with SIGKILL and started again; the time until it reported
  every replica running again, with the same containers (none restarted or duplicated). The
  replicas' state is reset to ``pending`` in the database while the agent is down, so the figure
  is the time until the control plane knows again, not a stale ``running``;
* **evict → free**: each replica evicted alone; the time until its slice is free (its row is
  gone: the agent stopped the workload and said so);
* **moves**: each replica (up to :data:`MAX_MOVES`) moved to a free slice, make before break,
  while the deployment's running count is sampled: the time from the request to the move's
  success, and the **gap**, the time during which fewer replicas ran than before the move
  (0 ms is the goal: the old copy stops only once the new one runs).

The API is polled every 50 ms (the figures' resolution). The user API rate limit is raised for
the bench's token so that polling is not throttled.
"""
