"""Child process of test_veros_kill.py: ``ensio cycle ARGS...`` reporting its fault points.

With ``ENSIO_TEST_REPORT_POINTS`` set, every fault point the driver reaches is written
as ``point LABEL`` to fd 1 before it goes on (unbuffered, so none is lost at a kill),
so the parent can SIGKILL the driver right after a drawn one and know where the kill
landed (kill_support.py). Only the driver reports: its worker jobs are separate
processes that never install the hook.
"""

from __future__ import annotations

import os
import sys

from ensio import faults
from ensio.cli.main import main

if __name__ == "__main__":
    if os.environ.get("ENSIO_TEST_REPORT_POINTS"):
        faults.set_hook(lambda label: os.write(1, f"point {label}\n".encode()))
    sys.exit(main(["cycle", *sys.argv[1:]]))
