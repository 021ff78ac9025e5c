"""Child of the backup kill tests: one node's backup worker, ready after its imports.

Prints ``ready`` once everything is imported, so the parent's random kill
moment falls into the copy, not into Python's start-up. With
``ENSIO_TEST_REPORT_POINTS`` set it writes ``point LABEL`` to stdout at every
fault point (from the copy threads too), so the parent can kill it right after
a chosen one and know where the kill landed (kill_support.py).
"""

import os
import sys

from ensio import faults
from ensio.io.node.backupworker import main

if os.environ.get("ENSIO_TEST_REPORT_POINTS"):  # unbuffered: no report lost at a kill
    faults.set_hook(lambda label: os.write(1, f"point {label}\n".encode()))

print("ready", flush=True)
sys.exit(main(sys.argv[1:]))
