"""Child of the safety tests: ``ensio ARGS`` that can pause at a fault point.

With ``ENSIO_TEST_PAUSE_AT=LABEL`` (or ``LABEL:N`` for the N-th time the
point is passed) the process prints ``paused LABEL`` and its pid on stdout
when it reaches that point, and waits for a line on stdin before it goes on:
the parent starts a second run, or sends a signal, at a known step — no
sleeps. Exit status is the command's.
"""

import os
import sys

from ensio import faults
from ensio.cli.main import main

spec = os.environ.get("ENSIO_TEST_PAUSE_AT")
if spec:
    label, _, nth = spec.partition(":")
    seen = [0]

    def pause(point: str) -> None:
        if point != label:
            return
        seen[0] += 1
        if seen[0] == int(nth or 1):
            print(f"paused {point} {os.getpid()}", flush=True)
            sys.stdin.readline()

    faults.set_hook(pause)
sys.exit(main(sys.argv[1:]))
