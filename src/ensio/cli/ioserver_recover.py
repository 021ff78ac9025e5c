"""``ensio ioserver recover DIR``: publish what a killed I/O server left in DIR.

A server writes each output file as a hidden staging file
(``.NAME.ensio-partial.ioserver``) and publishes it when the file is closed. A
server killed (or a job ended by a dead rank, or a full disk) leaves staging
files holding exactly the records that were complete; this command publishes
each one under its final name in its configured format (or deletes it when it
holds no complete record), one line per file. Files a live server is writing
are left alone. A server starting in DIR does the same by itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["run_recover"]


def run_recover(args: argparse.Namespace) -> int:
    from ..errors import ConfigError, file_op
    from ..ioserver.recovery import recover_dir

    if args.source is None:
        raise ConfigError("ensio ioserver recover: give the output directory")
    directory = Path(args.source)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such directory")
    with file_op("recover", directory):
        done = recover_dir(directory)
    if not done:
        print(f"ensio ioserver recover: {directory}: nothing to recover")
    return 0
