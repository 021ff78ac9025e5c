"""The pure parts of ``io.mode: shuffle``: row sets, run cutting, the rank plan, the config.

Checked against brute force (one index per row, one owner per row), not
against the code's own output. The collective parts are in
tests/mpi/test_shuffle_mpi.py and, on 8 oversubscribed ranks, in
:func:`test_shuffle_on_eight_ranks`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import matrix
import needs
import numpy as np
import pytest
from seeds import draw_seed

from ensio.config import ConfigError, config_from_dict
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.modes.shuffleplan import ShufflePlan, cut_runs, shuffle_shape
from ensio.io.tiles.tilefile import plan_runs, tile_rows
from ensio.layout.state import StateLayout, VariableLayout
from ensio.layout.tiles import declared_geometry
from ensio.parallel.distribution import RowDistribution
from ensio.parallel.rowsets import RowSets


def test_row_sets_against_an_owner_per_row(rng) -> None:
    n, size = 97, 5
    owner = rng.integers(0, size, n)
    cuts = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate([[0], cuts])
    lengths = np.diff(np.append(starts, n))
    perm = rng.permutation(starts.size)  # pieces in any order
    for rank in range(size):
        sets = RowSets.from_pieces(n, size, rank, starts[perm], lengths[perm], owner[starts][perm])
        assert sets.rows.tolist() == np.flatnonzero(owner == rank).tolist()
        assert sets.owner(np.arange(n)).tolist() == owner.tolist()
        assert sets.local(sets.rows).tolist() == list(range(sets.count))
        assert sets.counts().tolist() == np.bincount(owner, minlength=size).tolist()
    with pytest.raises(ValueError, match="does not own"):
        sets.local(np.flatnonzero(owner != size - 1)[:1])


def test_row_sets_reject_gaps_and_overlaps() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        RowSets.from_pieces(10, 2, 0, np.array([0, 6]), np.array([5, 4]), np.array([0, 1]))
    with pytest.raises(ValueError, match="exactly once"):
        RowSets.from_pieces(10, 2, 0, np.array([0, 4]), np.array([5, 6]), np.array([0, 1]))


def test_blocks_equal_the_block_distribution() -> None:
    dist = RowDistribution(23, 4, 2)
    sets = RowSets.blocks(23, dist.starts, 2)
    assert sets.rows.tolist() == list(range(dist.start, dist.stop))
    rows = np.arange(23)
    assert sets.owner(rows).tolist() == dist.owner(rows).tolist()


def test_cut_runs_against_a_flat_list(rng) -> None:
    lengths = rng.integers(1, 6, 12)
    starts = np.cumsum(rng.integers(1, 4, 12) + np.concatenate([[0], lengths[:-1]]))
    flat = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
    inner = np.sort(rng.choice(np.arange(1, flat.size), 4, replace=False))
    bounds = np.concatenate([[0], inner, [flat.size]])
    ps, pl, k = cut_runs(starts, lengths, bounds)
    got = np.concatenate([np.arange(s, s + n) for s, n in zip(ps, pl, strict=True)])
    assert got.tolist() == flat.tolist()
    which = np.repeat(k, pl)
    want = np.searchsorted(bounds, np.arange(flat.size), side="right") - 1
    assert which.tolist() == want.tolist()


def _layout(shapes: list[tuple[int, ...]]) -> StateLayout:
    vs, off = [], 0
    for i, shape in enumerate(shapes):
        size = int(np.prod(shape))
        vs.append(VariableLayout(name=f"v{i}", dims=tuple(f"d{j}" for j in range(len(shape))),
                                 shape=shape, dtype=np.dtype("f8"), offset=off, size=size))
        off += size
    return StateLayout(variables=tuple(vs), n_rows=off)


@pytest.mark.parametrize("n_e,layout,s", [(3, (2, 2), 1), (2, (3, 1), 2), (4, (1, 1), 3)])
def test_plan_against_brute_force(n_e, layout, s) -> None:
    """Rank q·N_e·P + m·P + p gets chunk m of part q of tile p; the rows cover the state once."""
    grid = (7, 9)
    lay = _layout([(7, 9), (2, 7, 9)])
    geo = declared_geometry(grid, layout[0] * layout[1], layout, 1)
    runs = plan_runs(geo, lay)
    p_count = geo.count
    size = n_e * p_count * s
    owner = np.full(lay.n_rows, -1)
    for v in lay.variables:  # brute force: every row's tile from its (y, x)
        flat = np.arange(v.size)
        y, x = (flat // grid[1]) % grid[0], flat % grid[1]
        tile = np.array([next(b.index for b in geo.boxes if b.y0 <= yy < b.y1 and b.x0 <= xx < b.x1)
                         for yy, xx in zip(y, x, strict=True)])  # fmt: skip
        owner[v.offset + flat] = tile
    seen = np.zeros(lay.n_rows, dtype=int)
    for rank in range(size):
        plan = ShufflePlan.build(runs, lay.n_rows, n_e, size, rank)
        m, p, q = plan.member, plan.tile, plan.part
        assert rank == q * n_e * p_count + m * p_count + p
        tile_all = np.flatnonzero(owner == p)
        parts = np.array_split(tile_all, s)  # block pieces, first ones larger
        part = parts[q]
        assert plan.part_rows == part.size
        assert tile_rows(runs[p], *plan.window).tolist() == part.tolist()
        chunks = np.array_split(part, n_e)
        assert plan.rows.rows.tolist() == chunks[m].tolist()
        assert plan.chunk_counts.tolist() == [c.size for c in chunks]
        seen[plan.rows.rows] += 1
    assert (seen == 1).all()


def test_rank_count_must_be_a_multiple() -> None:
    assert shuffle_shape(12, 3, 2) == 2
    with pytest.raises(ConfigError, match=r"^io.mode: shuffle needs .* of 6; got N_mpi = 4$"):
        shuffle_shape(4, 3, 2)


def test_config_keys() -> None:
    base = {"ensemble": {"members": "m{member}_{tile}.nc", "size": 2, "variables": ["state"]}}
    with pytest.raises(ConfigError, match="^io.local_dir: required when io.mode is shuffle$"):
        config_from_dict({**base, "io": {"mode": "shuffle"}})
    flat = config_from_dict({"ensemble": {"members": "m{member}.nc", "size": 2,
                                          "variables": ["state"]},
                             "io": {"mode": "shuffle", "local_dir": "/l"}})  # fmt: skip
    from mpi4py import MPI

    with pytest.raises(ConfigError, match=r"^io.mode: shuffle reads the node-local copies "
                                          r"of io.local_dir, not a list of member paths"):
        open_ensemble([Path("m1.nc")], flat.ensemble, flat.io, MPI.COMM_SELF)


def test_shuffle_on_eight_ranks() -> None:
    """8 ranks on this machine (oversubscribed).

    (N_e, P, S) = (2, 4, 1), (4, 2, 1), (2, 2, 2), (8, 1, 1), each against files mode,
    for each of the four cases of the test (2-D, levels, NEMO attributes, masked).
    """
    mpiexec = str(needs.mpiexec(path_fallback=True))
    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(here.parent / "src"), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    # every (N_e, P, S) layout runs in each case; the default run draws one of the four
    # cases (an oversubscribed 8-rank run is slow), ENSIO_TEST_FULL all of them
    cases = ["None-False-False", "2-False-False", "None-True-False", "2-False-True"]
    if not matrix.full():
        cases = [random.Random(draw_seed("8-rank shuffle case")).choice(cases)]
    select = " or ".join(f"test_shuffle_analysis_equals_files_mode[{c}]" for c in cases)
    cmd = [mpiexec, "-n", "8", sys.executable, str(here / "mpi" / "run.py"), "-q", "-x",
           "-k", select]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"{len(cases)} passed" in out.stdout, out.stdout[-2000:]
