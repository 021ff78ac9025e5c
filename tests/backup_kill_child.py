"""Child of the backup kill tests: one node's backup worker, ready after its imports.

Prints ``ready`` once everything is imported, so the parent's random kill
moment falls into the copy, not into Python's start-up.
"""

import sys

from ensio.io.backupworker import main

print("ready", flush=True)
sys.exit(main(sys.argv[1:]))
