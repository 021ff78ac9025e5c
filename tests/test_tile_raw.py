"""Raw tile reads (TileScan + tileread) against the netCDF-library path, on tiles of real tools.

The reference of every comparison is independent of the raw path: the
library read of the same tiles (:meth:`TiledEnsemble.read`, which opens each
tile through the netCDF library), and for tiles cut by the test helper the
single-file case read by ``files`` mode.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import needs
import numpy as np
import pytest
from mpi4py import MPI
from tiles_support import PATTERN, tile_case

from ensio.cli.synth import main as synth_main
from ensio.config.load import load_config
from ensio.errors import InputError
from ensio.io.modes.ensemble import read_ensemble
from ensio.io.modes.tiledio import TiledEnsembleIO
from ensio.io.tiles import tileread
from ensio.io.tiles.tiled import TiledEnsemble
from ensio.layout.tiles import declared_geometry

NX, NY, NE = 13, 10, 3
GEO = declared_geometry((NY, NX), 4, (2, 2), 1)
SETS = [f"ensemble.members={PATTERN}", "ensemble.tiles={count: 4, layout: [2, 2], halo: 1}"]


def _case(root: Path, fmt: str, dtype: str = "float64", levels: int | None = None) -> Path:
    out = root / "case"
    argv = [str(out), "--nx", str(NX), "--ny", str(NY), "--members", str(NE), "--seed", "7",
            "--format", fmt, "--dtype", dtype]  # fmt: skip
    if levels:
        argv += ["--levels", str(levels)]
    assert synth_main(argv) == 0
    tile_case(out, GEO, NE)
    return out


def _tiles(case: Path) -> list[Path]:
    return sorted((case / "tiles").glob("*.nc"))


def _rewrite(case: Path, tool: list[str]) -> None:
    """Every tile rewritten by an external tool (``{src}``/``{dst}`` in ``tool``)."""
    for path in _tiles(case):
        tmp = path.with_suffix(".tmp.nc")
        argv = [a.format(src=path, dst=tmp) for a in tool]
        subprocess.run(argv, check=True, capture_output=True)
        tmp.replace(path)


def _ncgen(case: Path, kind: str) -> None:
    """ncdump (full precision) | ncgen: the tiles as ncgen writes them."""
    for path in _tiles(case):
        cdl = subprocess.run(["ncdump", "-p", "9,17", str(path)], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        tmp = path.with_suffix(".tmp.nc")
        subprocess.run(["ncgen", "-k", kind, "-o", str(tmp)], input=cdl, check=True,
                       capture_output=True, text=True)  # fmt: skip
        tmp.replace(path)


def _both(case: Path) -> tuple[np.ndarray, np.ndarray, TiledEnsembleIO]:
    """(raw read by the collective reader, library read of the same tiles, the reader)."""
    cfg = load_config(case / "ensio.yaml", SETS)
    library = TiledEnsemble(cfg.ensemble, cfg.base_dir).read()
    io = TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF)
    return io.read().data, library, io


WRITERS = {
    "nccopy-nc4-contiguous": ("netcdf4", ["nccopy", "-k", "nc4", "{src}", "{dst}"], True),
    "nccopy-nc4-chunked": ("netcdf4", ["nccopy", "-k", "nc4", "-d", "1", "-c", "lat/3,lon/4",
                                       "{src}", "{dst}"], False),  # fmt: skip
    "nccopy-cdf5": ("netcdf4", ["nccopy", "-k", "cdf5", "{src}", "{dst}"], True),
    "ncgen-nc4": ("cdf5", "nc4", True),
    "ncgen-cdf5": ("netcdf4", "cdf5", True),
    # cdo chunks netCDF-4 variables by level: the library fallback
    "cdo-nc4": ("cdf5", ["cdo", "-s", "-f", "nc4", "copy", "{src}", "{dst}"], False),
    "cdo-cdf5": ("netcdf4", ["cdo", "-s", "-f", "nc5", "copy", "{src}", "{dst}"], True),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("strided", [True, False])
def test_raw_equals_library_on_tool_written_tiles(tmp_path, writer, strided, monkeypatch) -> None:
    """The raw path (contiguous tiles) or its fallback (chunked) gives the library's matrix."""
    monkeypatch.setattr(tileread, "STRIDED", strided)
    fmt, tool, contiguous = WRITERS[writer]
    case = _case(tmp_path, fmt, levels=2)
    if isinstance(tool, str):
        _ncgen(case, tool)
    else:
        needs.tool(tool[0])
        _rewrite(case, tool)
    raw, library, io = _both(case)
    assert raw.tobytes() == library.tobytes()
    infos = [i["state"] for tiles in io.scan.infos for i in tiles]
    assert all(tileread.direct(i) for i in infos) == contiguous
    assert contiguous == all(i.raw_offset is not None for i in infos)
    if contiguous:  # a tile of the same program's output passes the quick check
        io.scan.invalidate()
        io.scan.refresh()
        assert io.scan.quick == io.scan.checked == NE * GEO.count


@pytest.mark.parametrize(("fmt", "dtype"), [("netcdf4", "float64"), ("cdf5", "float64"),
                                            ("cdf5", "float32"), ("netcdf4", "float32")])
@pytest.mark.parametrize("strided", [True, False])
def test_raw_read_equals_single_file(tmp_path, fmt, dtype, strided, monkeypatch) -> None:
    """Bitwise the single-file case: byte-swapped (CDF-5), 4-byte (through a range read)."""
    monkeypatch.setattr(tileread, "STRIDED", strided)
    case = _case(tmp_path, fmt, dtype, levels=3)
    want = read_ensemble(load_config(case / "ensio.yaml"), MPI.COMM_SELF).data
    raw, library, _ = _both(case)
    assert raw.tobytes() == want.tobytes() == library.tobytes()


def test_read_into_previous_block(tmp_path) -> None:
    """A repeated read into the previous matrix refills it (no stale values left)."""
    case = _case(tmp_path, "cdf5")
    raw, _, io = _both(case)
    block = io.read()
    block.data[...] = -1.0
    again = io.read(out=block)
    assert again.data is block.data and again.data.tobytes() == raw.tobytes()


def test_changed_tile_is_checked_again(tmp_path) -> None:
    """A tile rewritten (new offsets) between reads is checked again, values follow."""
    case = _case(tmp_path, "netcdf4")
    _, _, io = _both(case)
    path = case / PATTERN.format(member=2, tile=3)
    tmp = path.with_suffix(".tmp.nc")
    subprocess.run(["nccopy", "-k", "cdf5", str(path), str(tmp)], check=True)
    tmp.replace(path)
    cfg = load_config(case / "ensio.yaml", SETS)
    want = TiledEnsemble(cfg.ensemble, cfg.base_dir).read()
    assert io.read().data.tobytes() == want.tobytes()
    assert io.scan.checked == 1


def test_truncated_tile_one_line_error(tmp_path) -> None:
    case = _case(tmp_path, "cdf5")
    cfg = load_config(case / "ensio.yaml", SETS)
    io = TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF)
    path = case / PATTERN.format(member=3, tile=2)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)  # within the state variable's interior
    with pytest.raises(InputError) as err:
        io.read()
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg and "truncated" in msg


@pytest.mark.parametrize("fmt", ["netcdf4", "cdf5"])
def test_corrupt_tile_one_line_error(tmp_path, fmt) -> None:
    """A tile whose header is garbage is refused at open, naming the file; nothing written."""
    case = _case(tmp_path, fmt)
    path = case / PATTERN.format(member=2, tile=1)
    with open(path, "r+b") as fh:
        fh.write(b"garbage!" * 8)
    before = {p: p.read_bytes() for p in _tiles(case)}
    cfg = load_config(case / "ensio.yaml", SETS)
    with pytest.raises(InputError) as err:
        TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg
    assert {p: p.read_bytes() for p in _tiles(case)} == before


@pytest.mark.parametrize("strided", [True, False])
def test_short_reads_and_batches(tmp_path, monkeypatch, strided) -> None:
    """preadv returning a few bytes at a time, batches of 3 buffers, both raw paths: the
    library's matrix."""
    case = _case(tmp_path, "netcdf4", levels=2)
    _, raw, io = _both(case)
    monkeypatch.setattr(tileread, "STRIDED", strided)
    real = tileread.os.preadv

    def short(fd, bufs, offset):
        first = bufs[0]
        return real(fd, [first[: min(len(first), 5)]], offset)

    monkeypatch.setattr(tileread.os, "preadv", short)
    monkeypatch.setattr(tileread, "_IOV_MAX", 3)
    assert io.read().data.tobytes() == raw.tobytes()


@pytest.mark.parametrize("fmt", ["netcdf4", "cdf5"])
def test_read_tile_windows_raw_equals_library(tmp_path, rng, fmt) -> None:
    """The shuffle's per-tile reader: byte ranges and the library agree on any row window."""
    from ensio.io.tiles.tilefile import read_tile

    case = _case(tmp_path, fmt, levels=2)
    cfg = load_config(case / "ensio.yaml", SETS)
    ens = TiledEnsemble(cfg.ensemble, cfg.base_dir)
    io = TiledEnsembleIO(cfg.ensemble, cfg.base_dir, cfg.io, MPI.COMM_SELF)
    n = ens.layout.n_rows
    for _ in range(6):
        lo, hi = sorted(int(x) for x in rng.integers(0, n + 1, size=2))
        for t in range(GEO.count):
            path = ens.paths[1][t]
            want = read_tile(path, ens.names, ens.runs[t], lo, hi)
            got = read_tile(path, ens.names, ens.runs[t], lo, hi, infos=io.scan.infos[1][t])
            assert got[0].tobytes() == want[0].tobytes()
            assert got[1].tobytes() == want[1].tobytes()
