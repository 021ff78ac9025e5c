"""``io.mode: shuffle`` with one node-local directory shared by the ranks (issue 25, item 7).

A node's ``/local`` is shared by all its ranks, so ``io.local_dir`` without
``{rank}`` is the usual case: its lock and journal are per directory and per
run (:mod:`ensio.locks`: the ranks of one run join the lock its first
holder took), while a directory held by another live run is refused, naming
that run, with nothing modified.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import matrix
import needs
from safety_support import env
from seeds import draw_seed
from shuffle_commit_support import make_shuffle_case

HERE = Path(__file__).parent
HOLD = """
import sys
from ensio.locks import EnsembleLock
lock = EnsembleLock(sys.argv[1], "ensio analyse other.yaml", run="another-run").acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
"""


def test_shared_local_dir_on_eight_ranks() -> None:
    """8 ranks on this machine (oversubscribed), one local directory for all of them
    (a copy of every tile, and the global directory itself): (N_e, P, S) = (2, 4, 1),
    (4, 2, 1), (2, 2, 2), (8, 1, 1) each equal ``files`` mode to 1e-12
    (tests/mpi/test_shuffle_shared_mpi.py)."""
    mpiexec = str(needs.mpiexec(path_fallback=True))
    run_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    # the shared copy and the global directory; the default run draws one (an
    # oversubscribed 8-rank run is slow), ENSIO_TEST_FULL both; -n 4 runs both in tests/mpi
    wheres = ["node", "global"]
    if not matrix.full():
        wheres = [random.Random(draw_seed("8-rank shared directory")).choice(wheres)]
    select = " or ".join(f"test_shared_local_dir_equals_files_mode[{w}]" for w in wheres)
    cmd = [mpiexec, "-n", "8", sys.executable, str(HERE / "mpi" / "run.py"), "-q", "-x",
           "-k", select]  # fmt: skip
    out = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{len(wheres)} passed" in out.stdout, out.stdout[-2000:]


def _digests(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def test_directory_of_another_live_run_is_refused(tmp_path) -> None:
    """4 ranks (2 members x 2 tiles) sharing one local directory: while another live
    run (another process, another run id) holds it, ``ensio analyse`` exits 2 naming
    that run and modifies nothing; once it is gone, the 4 ranks share it as one run."""
    mpiexec = str(needs.mpiexec(path_fallback=True))
    case = make_shuffle_case(tmp_path / "case", 4)
    node = case.root / "node"
    node.mkdir()
    tiles = [node / t.name for t in case.tiles()]
    for t in case.tiles():
        shutil.copy(t, node / t.name)
    before = _digests(tiles)
    cmd = [mpiexec, "-n", "4", sys.executable, "-m", "ensio", "analyse", str(case.config),
           "--set", f"io.local_dir={node}"]  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(node)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env())  # fmt: skip
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    finally:
        assert other.stdin is not None
        other.stdin.write("\n")
        other.stdin.close()
        assert other.wait(timeout=60) == 0
    assert refused.returncode == 2, refused.stderr
    errors = [x for x in refused.stderr.splitlines() if x.startswith("ensio: error:")]
    assert errors == [f"ensio: error: members locked by `ensio analyse other.yaml` (host "
                      f"{os.uname().nodename}, pid {other.pid}, started "
                      + errors[0].split("started ")[1]], refused.stderr  # fmt: skip
    assert errors[0].endswith(f"{node}/.ensio-lock")
    assert _digests(tiles) == before
    assert not (case.global_dir / ".ensio-runs.jsonl").exists()

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env())
    assert done.returncode == 0, done.stderr
    assert all(a != b for a, b in zip(_digests(tiles), before, strict=True))
    assert sorted(x.name for x in node.iterdir()) == sorted(t.name for t in tiles)
