"""An agent's supervisor in a process of its own, driven over stdin/stdout (one JSON object per
line), so a test can SIGKILL it and start another from the same state directory.

``python -m tests.hostagent.runtime.agent_child --state-dir D --hostname H --runtime R``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hostagent.runtime import ReplicaSpec, Supervisor, Timing, build_runtimes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--runtime", choices=["docker", "process"], required=True)
    args = parser.parse_args()
    runtimes = build_runtimes(
        args.runtime,
        hostname=args.hostname,
        state_dir=args.state_dir,
        allow_process=True,
        process_as_agent_user=True,
        image_pull="if-not-present",
    )
    supervisor = Supervisor(
        runtimes,
        agent_runtime=args.runtime,
        state_dir=args.state_dir,
        timing=Timing.scaled(0.01, poll_s=0.05),
    )
    supervisor.start()
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        answer: object = None
        if op == "place":
            specs = [ReplicaSpec(**spec) for spec in command["specs"]]
            supervisor.place(command["gpu"], specs)
        elif op == "authorize":
            supervisor.authorize(command["gpus"])
        elif op == "report":
            answer = supervisor.take_report(full=True)
        elif op == "events":
            answer = supervisor.take_events()
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
