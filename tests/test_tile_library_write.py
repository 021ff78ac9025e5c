"""Writing tiles whose state variables are chunked or compressed (library path, one owner).

Tiles are rewritten by real tools (``nccopy -d 1 -c``, ``cdo -f nc4``) the
way XIOS-style model output is chunked; the reference of every comparison is
the analysis of the untiled single files. Kill tests: a SIGKILL at any
fault point of ``ensio analyse``, then a rerun, leaves every tile bitwise as
an uninterrupted run does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import matrix
import needs
import numpy as np
import pytest
from mpi4py import MPI
from tiles_support import PATTERN, box_with_halo, tile_case, tile_values

from ensio.analysis.inputs import assimilate_block, observation_sources
from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.io.modes.ensemble import read_ensemble
from ensio.io.modes.tiledio import TiledEnsembleIO
from ensio.io.tiles import tilerewrite
from ensio.layout.block import EnsembleBlock
from ensio.layout.tiles import declared_geometry

NX, NY, NE = 13, 10, 3
GEO = declared_geometry((NY, NX), 4, (2, 2), 1)
SETS = [f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}",
        "output.mean=null", "output.spread=null"]  # fmt: skip
TOOLS = {
    "nccopy-deflate": ["nccopy", "-k", "nc4", "-d", "1", "-c", "lat/3,lon/4", "{src}", "{dst}"],
    "cdo-nc4": ["cdo", "-s", "-f", "nc4", "copy", "{src}", "{dst}"],
}


def _case(root: Path, tool: str, which: set[int] | None) -> Path:
    """Synthetic 2-level members, tiled 2 × 2; tiles ``which`` (None: all) rewritten by ``tool``."""
    argv = TOOLS[tool]
    needs.tool(argv[0])
    case = root / "case"
    assert synth_main([str(case), "--nx", str(NX), "--ny", str(NY), "--members", str(NE),
                       "--seed", "11", "--format", "cdf5", "--levels", "2"]) == 0  # fmt: skip
    tile_case(case, GEO, NE)
    for m in range(1, NE + 1):
        for t in range(GEO.count):
            if which is not None and t not in which:
                continue
            path = case / PATTERN.format(member=m, tile=t)
            tmp = path.with_suffix(".tmp.nc")
            subprocess.run([a.format(src=path, dst=tmp) for a in argv], check=True,
                           capture_output=True)  # fmt: skip
            tmp.replace(path)
    return case


def _digests(case: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((case / "tiles").glob("*.nc"))}  # fmt: skip


def _single_analysis(case: Path) -> np.ndarray:
    cfg = load_config(case / "ensio.yaml")
    prior = read_ensemble(cfg, MPI.COMM_SELF)
    obs = observation_sources(cfg.observations, cfg.resolve)
    return assimilate_block(prior, obs, cfg.analysis, MPI.COMM_SELF, cycle=0,
                            seconds={}).ensemble  # fmt: skip


def _assert_holds(case: Path, want: np.ndarray, before: dict) -> None:
    shape = (2, NY, NX)
    for m in range(1, NE + 1):
        field = want[m - 1].reshape(shape)
        for b in GEO.boxes:
            got = tile_values(case / PATTERN.format(member=m, tile=b.index))
            iy, ix = b.interior()
            ys, xs = box_with_halo(b)
            np.testing.assert_allclose(got[..., iy, ix], field[..., ys, xs][..., iy, ix],
                                       rtol=0, atol=1e-12)  # fmt: skip
            halo = np.ones(b.file_shape, dtype=bool)
            halo[iy, ix] = False
            assert got[..., halo].tobytes() == before[m, b.index][..., halo].tobytes()


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("which", [None, {0, 3}], ids=["all", "mixed"])
def test_chunked_tiles_take_the_single_file_analysis(tmp_path, tool, which) -> None:
    """Chunked/compressed tiles (all, or some beside contiguous ones) get the analysis of
    the single files in their interiors; halos keep their values; the files stay valid."""
    case = _case(tmp_path, tool, which)
    want = _single_analysis(case)
    before = {(m, b.index): tile_values(case / PATTERN.format(member=m, tile=b.index))
              for m in range(1, NE + 1) for b in GEO.boxes}  # fmt: skip
    cfg = load_config(case / "ensio.yaml", SETS)
    obs = observation_sources(cfg.observations, cfg.resolve)
    with TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF) as io:
        block = io.read()
        lib = tilerewrite.library_tiles(io.scan.refresh(), ["state"])
        assert len(lib) == NE * (GEO.count if which is None else len(which))
        got = assimilate_block(block, obs, cfg.analysis, MPI.COMM_SELF, cycle=0, seconds={})
        io.write(EnsembleBlock(block.layout, block.start, block.count, got.ensemble))
    _assert_holds(case, want, before)
    if shutil.which("ncdump") is not None:  # the rewritten tiles are valid netCDF
        subprocess.run(["ncdump", "-h", str(case / PATTERN.format(member=1, tile=0))],
                       check=True, capture_output=True)  # fmt: skip


def test_failed_library_rewrite_rolls_back_every_tile(tmp_path, monkeypatch) -> None:
    """The third library rewrite fails: every tile, raw or rewritten, is byte-identical after."""
    case = _case(tmp_path, "nccopy-deflate", {0, 3})
    snap = _digests(case)
    real, calls = tilerewrite.rewrite_tile, []

    def failing(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(tilerewrite, "rewrite_tile", failing)
    cfg = load_config(case / "ensio.yaml", SETS)
    with TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF) as io:
        block = io.read()
        with pytest.raises(OSError, match="disk full"):
            io.write(EnsembleBlock(block.layout, block.start, block.count, block.data + 1.0))
    assert len(calls) == 3
    assert _digests(case) == snap


def _analyse(case: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT_")}
    sets = [a for kv in SETS for a in ("--set", kv)]
    return subprocess.run([sys.executable, "-m", "ensio", "analyse", str(case / "ensio.yaml"),
                           *sets], env=clean | env, capture_output=True, text=True)  # fmt: skip


def test_kill_anywhere_then_rerun_equals_one_clean_run(tmp_path, rng) -> None:
    """SIGKILL at fault points of ``ensio analyse`` on mixed tiles, then a rerun: every tile
    bitwise as after one uninterrupted run (rolled back and redone, or rolled forward)."""
    clean = _case(tmp_path / "clean", "nccopy-deflate", {1})
    pristine = tmp_path / "pristine"
    shutil.copytree(clean, pristine)
    count = tmp_path / "count.jsonl"
    done = _analyse(clean, ENSIO_FAULT_COUNT=str(count))
    assert done.returncode == 0, done.stderr
    want = {m: {b.index: tile_values(clean / PATTERN.format(member=m, tile=b.index))
                for b in GEO.boxes} for m in range(1, NE + 1)}  # fmt: skip
    n = json.loads(count.read_text().splitlines()[-1])["count"]
    assert n > 3
    for k in sorted({1, n, *rng.integers(2, n, matrix.draws(1, 4)).tolist()}):
        case = tmp_path / f"k{k}"
        shutil.copytree(pristine, case)
        killed = _analyse(case, ENSIO_FAULT_KILL_AT=str(k))
        assert killed.returncode == -signal.SIGKILL, (k, killed.stderr)
        again = _analyse(case)
        assert again.returncode == 0, (k, again.stderr)
        for m in range(1, NE + 1):
            for b in GEO.boxes:
                got = tile_values(case / PATTERN.format(member=m, tile=b.index))
                assert got.tobytes() == want[m][b.index].tobytes(), (k, m, b.index)
