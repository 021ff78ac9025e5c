"""Server ranks for the C test model (MPMD): ``cserver.py CONFIG OUTDIR``.

The servers record what they assemble (iocore_model.py's Recorder); which steps each
field is needed at is fixed here as in the C client's stub test: tas and sst
every step, ta every 2nd, cu every 3rd and 4th, pr never.
"""

import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from iocore_model import Recorder  # noqa: E402

from ensio import ioserver  # noqa: E402
from ensio.ioserver.configload import load_ioserver_config  # noqa: E402

PERIODS = {"tas": (1,), "ta": (2,), "cu": (3, 4), "sst": (1,), "pr": ()}


def periods(cfg, files):
    used = {fd.field_ref for f in cfg.files if f.id in files for fd in f.fields}
    return {f: PERIODS[f] if f in used else () for f in cfg.sources}


cfg = load_ioserver_config(sys.argv[1], [f"ioserver.output_dir={sys.argv[2]}"])
ioserver.start(MPI.COMM_WORLD, cfg, context="c", role="server", sink_factory=Recorder,
               periods=periods)
