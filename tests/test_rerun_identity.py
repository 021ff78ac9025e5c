"""The run record identifies an analysis by the members' contents, not by paths or mode.

Issue 25, item 6. A shuffle analysis records the sha256 of the node-local
tiles, a ``files`` analysis those of the global tiles; ``ensio stage out`` /
``stage in`` copy the bytes between them. The rerun check used to compare
paths, so after a shuffle analysis and ``stage out`` an ``io.mode: files``
run of the same prior assimilated the observations a second time (and the
reverse). Here each order is run with the real commands (``mpiexec -n 4``
for the shuffle, one process for ``files`` and the staging): the second run
reports ``already analysed`` and modifies nothing (sha256 of every file under
the case), ``--force`` assimilates again, and a record written before this
change (its entry without ``contents``) is still recognised.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from tiles_support import PATTERN, tile_case

from ensio.cli.main import main as ensio_main
from ensio.cli.synth import main as synth_main
from ensio.layout.tiles import declared_geometry

NX, NY, NE, P = 12, 9, 2, 2
RUNS = ".ensio-runs.jsonl"
TILED = [f"ensemble.members={PATTERN}",
         f"ensemble.tiles={{count: {P}, layout: [{P}, 1], halo: 1}}",
         "io.local_dir=local/r{rank}", "output.mean=an/mean_{tile}.nc",
         "output.spread=an/spread_{tile}.nc"]  # fmt: skip
SHUFFLE = [*TILED, "io.mode=shuffle"]
FILES = [*TILED, "io.mode=files"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rerun") / "case"
    argv = [str(out), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "11",
            "--format", "cdf5"]  # fmt: skip
    assert synth_main(argv) == 0
    tile_case(out, declared_geometry((NY, NX), P, (P, 1), 1), NE)
    for m in range(1, NE + 1):
        (out / f"mem{m:03d}.nc").unlink()  # only the tiles: no run can read anything else
    return out


@pytest.fixture
def case(base: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "case"
    shutil.copytree(base, dst)
    for r in range(NE * P):
        (dst / "local" / f"r{r}").mkdir(parents=True)
    return dst


def tree(case: Path) -> dict[str, str]:
    """Every file under the case (relative name -> sha256)."""
    return {str(p.relative_to(case)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(case.rglob("*")) if p.is_file()}  # fmt: skip


def _sets(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def ensio(*args: str, mpi: int = 0) -> subprocess.CompletedProcess:
    """The ``ensio`` command in a child process (under ``mpiexec -n mpi`` if mpi > 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT_")}
    cmd = [sys.executable, "-m", "ensio.cli.main", *args]
    if mpi:
        cmd = [str(needs.mpiexec(path_fallback=True)), "-n", str(mpi), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def analyse(case: Path, sets: list[str], *extra: str, mpi: int = 0) -> str:
    return ensio("analyse", str(case / "ensio.yaml"), *_sets(sets), *extra, mpi=mpi).stdout


def stage(case: Path, direction: str) -> None:
    ensio("stage", direction, str(case / "ensio.yaml"), *_sets(SHUFFLE), "--ranks",
          str(NE * P))


def tiles(case: Path) -> dict[str, str]:
    return {k: v for k, v in tree(case).items() if k.startswith("tiles/")}


def test_shuffle_then_stage_out_then_files(case) -> None:
    stage(case, "in")
    prior = tiles(case)
    out = analyse(case, SHUFFLE, mpi=NE * P)
    assert "posterior" in out, out
    stage(case, "out")
    analysed = tiles(case)
    assert all(analysed[k] != prior[k] for k in prior)  # stage out brought the analysis back
    before = tree(case)
    out = analyse(case, FILES)
    assert "already analysed" in out, out
    assert tree(case) == before
    out = analyse(case, FILES, "--force")  # assimilates again, on purpose
    assert "posterior" in out, out
    assert all(tiles(case)[k] != analysed[k] for k in analysed)


def test_files_then_stage_in_then_shuffle(case) -> None:
    out = analyse(case, FILES)
    assert "posterior" in out, out
    stage(case, "in")
    before = tree(case)
    out = analyse(case, SHUFFLE, mpi=NE * P)
    assert "already analysed" in out, out
    assert tree(case) == before


def test_moved_ensemble_is_still_analysed(case, tmp_path) -> None:
    """Paths are not the identity: the directory moved with its record is still done."""
    assert "posterior" in analyse(case, FILES)
    moved = tmp_path / "elsewhere"
    case.rename(moved)
    before = tree(moved)
    out = analyse(moved, FILES)
    assert "already analysed" in out, out
    assert tree(moved) == before


def test_record_without_contents_is_still_recognised(case, capsys) -> None:
    """A record written before identity by contents (no ``contents``, the key of the
    time, members keyed by path) still stops the rerun."""
    from ensio.config.load import load_config
    from ensio.io.txn.runrecord import path_run_key

    assert "posterior" in analyse(case, FILES)
    runs = case / "tiles" / RUNS
    entries = [json.loads(line) for line in runs.read_text().splitlines()]
    assert "contents" in entries[-1]
    cfg = load_config(case / "ensio.yaml", FILES)
    old = dict(entries[-1])
    del old["contents"]
    old["key"] = path_run_key(cfg, [cfg.resolve("obs.nc")], 0)
    runs.write_text(json.dumps(old, sort_keys=True) + "\n")
    before = tree(case)
    capsys.readouterr()
    assert ensio_main(["analyse", str(case / "ensio.yaml"), *_sets(FILES)]) == 0
    assert "already analysed" in capsys.readouterr().out
    assert tree(case) == before
