"""Write-back companions (issue 26): cyclic halo copies, other-level and ``also`` increments.

The maps of :mod:`ensio.layout.companions` against periodic indexing written here;
the files mode's write (byte-range path and library path) against
companions_support.expected; byte identity where nothing changes; the I/O tasks'
write ranges disjoint whatever the layout; a kill mid-write rolled back.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from companions_support import (
    DIMS,
    LEVELS,
    NX,
    NY,
    SHAPE,
    TAU,
    H,
    N,
    expected,
    make_layout,
    read_all,
    row_mask,
    write_members,
)
from mpi4py import MPI

from ensio.config.schema import IOSection
from ensio.io.modes.companionwrite import CompanionPlan
from ensio.io.modes.files import FileEnsembleIO
from ensio.io.txn.journal import recover
from ensio.layout.companions import build_companions, cyclic_targets, level_targets
from ensio.layout.state import StateLayout, VariableLayout

SELF = MPI.COMM_SELF


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------ the maps
def test_cyclic_targets_are_the_periodic_images(rng):
    shape = (3, 11, 9)  # (level, y, x): x cyclic with halo 2, y cyclic with halo 1
    hx, hy = 2, 1
    nx, ny = shape[2] - 2 * hx, shape[1] - 2 * hy
    rows = np.zeros(shape, dtype=bool)
    rows[1, hy:hy + ny, hx:hx + nx] = rng.random((ny, nx)) > 0.3
    elements = np.flatnonzero(rows)
    targets, src = cyclic_targets(shape, elements, {2: hx, 1: hy})
    # independent: every stored (y, x) at level 1 that is halo in x or y, with its
    # periodic source inside the interior
    sx = hx + (np.arange(shape[2]) - hx) % nx
    sy = hy + (np.arange(shape[1]) - hy) % ny
    want = {}
    for y in range(shape[1]):
        for x in range(shape[2]):
            if (y, x) != (sy[y], sx[x]) and rows[1, sy[y], sx[x]]:
                want[np.ravel_multi_index((1, y, x), shape)] = \
                    np.ravel_multi_index((1, sy[y], sx[x]), shape)
    got = dict(zip(targets.tolist(), elements[src].tolist(), strict=True))
    assert got == want and len(targets) == len(set(targets.tolist()))


def test_level_targets_every_other_level(rng):
    shape = (5, 4, 3)
    elements = np.flatnonzero(np.arange(np.prod(shape)).reshape(shape)[..., 1] >= 0) * 3 + 1
    parts = level_targets(shape, elements, 2)
    got = sorted((int(t), int(elements[r])) for tgt, rows in parts
                 for t, r in zip(tgt, rows, strict=True))
    want = sorted((e - 1 + lv, e) for e in elements.tolist() for lv in (0, 2))
    assert got == want


def test_build_companions_kinds_and_disjoint_targets(rng):
    ocean = rng.random((N, NY - 2)) > 0.2
    layout = make_layout(ocean)
    temp, salt = layout.variables
    kinds = [(c.kind, c.target) for c in temp.companions]
    assert kinds == [("copy", "temp"), ("increment", "temp"), ("increment", "tb")]
    assert [(c.kind, c.target) for c in salt.companions] == [("copy", "salt")]
    rows = set(temp.active.tolist())
    own = [c.target_elements for c in temp.companions if c.target == "temp"]
    flat = np.concatenate(own)
    assert len(set(flat.tolist())) == flat.size and not rows & set(flat.tolist())
    tb = temp.companions[2]
    assert set(tb.target_elements.tolist()) == rows | set(flat.tolist())


# ------------------------------------------------------------------- the write
def _analyse(members, layout, rng, *, zero: bool = False, keep_row: bool = True,
             tasks: int = 1) -> tuple[dict, dict, list]:
    """Read, perturb (or not), write; the priors, the rows written, the files after."""
    priors = [read_all(p) for p in members.paths]
    io = IOSection(tasks=tasks, journal=True, fsync=False)
    with FileEnsembleIO(members.paths, layout, io, SELF) as ens:
        block = ens.read()
        data = block.data.copy()
        if not zero:
            data += rng.normal(0.0, 0.5, data.shape)
            if keep_row:
                data[:, 3] = np.nan  # an inactive row: every member keeps its bytes
        ens.write(type(block)(block.layout, block.start, block.count, data))
    after = [read_all(p) for p in members.paths]
    rows = []
    for m in range(len(members.paths)):
        rows.append({v.name: data[m, v.offset:v.offset + v.size] for v in layout.variables})
    return priors, rows, after


def _check(priors, rows, after, ocean, **kw):
    for prior, r, got in zip(priors, rows, after, strict=True):
        want = expected(prior, r, ocean, **kw)
        for name in ("temp", "tb", "salt", "other"):
            exact = np.ones(SHAPE, dtype=bool)
            if name in ("temp", "tb"):  # increments: old + (analysis - prior), to rounding
                exact[:, :, [lv for lv in range(LEVELS) if lv != TAU]] = False
                if name == "tb":
                    exact[:] = False
            np.testing.assert_array_equal(got[name][exact].view(np.uint8),
                                          want[name][exact].view(np.uint8), err_msg=name)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0,
                                       err_msg=name)
            unchanged = want[name].view(np.uint8) == prior[name].view(np.uint8)
            assert (got[name].view(np.uint8)[unchanged] ==
                    prior[name].view(np.uint8)[unchanged]).all(), name


@pytest.mark.parametrize("chunked", [False, True], ids=["byte-range", "library"])
@pytest.mark.parametrize("increment", ["all", "current"])
def test_write_back_matches_the_rule(tmp_path, rng, chunked, increment):
    members = write_members(tmp_path, 3, rng, chunked=chunked)
    layout = make_layout(members.ocean, increment=increment)
    priors, rows, after = _analyse(members, layout, rng)
    _check(priors, rows, after, members.ocean, increment=increment)
    # the halo of the state level is now an exact copy of the opposite interior
    src = H + (np.arange(NX) - H) % N
    mask = row_mask(members.ocean)
    for got in after:
        halo = got["temp"][:, :, TAU]
        wrapped = halo[src]
        hit = mask[src][:, :, TAU]
        assert (halo[hit].view(np.uint64) == wrapped[hit].view(np.uint64)).all()


@pytest.mark.parametrize("chunked", [False, True], ids=["byte-range", "library"])
def test_zero_increment_leaves_every_byte(tmp_path, rng, chunked):
    members = write_members(tmp_path, 3, rng, chunked=chunked, consistent=False)
    before = [digest(p) for p in members.paths]
    inodes = [os.stat(p).st_ino for p in members.paths]
    layout = make_layout(members.ocean)
    _analyse(members, layout, rng, zero=True)
    assert [digest(p) for p in members.paths] == before
    assert [os.stat(p).st_ino for p in members.paths] == inodes  # not even rewritten


def test_inconsistent_halo_is_copied_only_where_the_row_changed(tmp_path, rng):
    members = write_members(tmp_path, 2, rng, consistent=False)
    layout = make_layout(members.ocean)
    priors, rows, after = _analyse(members, layout, rng)
    _check(priors, rows, after, members.ocean)


def test_also_variable_must_exist_with_the_shape(tmp_path, rng):
    from ensio.errors import InputError

    members = write_members(tmp_path, 2, rng)
    layout = make_layout(members.ocean)
    temp = layout.variables[0]
    bad = [c if c.target != "tb" else type(c)(c.kind, "nosuch", c.target_elements,
                                              c.source_rows) for c in temp.companions]
    broken = StateLayout((VariableLayout(temp.name, temp.dims, temp.shape, temp.dtype,
                                         temp.offset, temp.size, temp.active,
                                         companions=tuple(bad)),
                          layout.variables[1]), layout.n_rows)
    with pytest.raises(InputError, match=r"mem01\.nc: variable 'nosuch' \(the also of 'temp'\)"):
        FileEnsembleIO(members.paths, broken, IOSection(tasks=1), SELF)


# -------------------------------------------------- disjoint ranges of the I/O tasks
@pytest.mark.parametrize("order", ["x-first", "y-x"])
def test_task_ranges_are_disjoint_and_cover_every_written_element(rng, order):
    """Any split of the rows over I/O tasks: no element in two tasks' ranges, all written."""
    if order == "x-first":
        shape, dims = SHAPE, DIMS
        rows = row_mask(rng.random((N, NY - 2)) > 0.2)
    else:  # (level, y, x): a halo column between the rows of one y line
        shape, dims = (LEVELS, NY, NX), ("level", "y", "x")
        rows = np.zeros(shape, dtype=bool)
        rows[TAU, 1:NY - 1, H:H + N] = rng.random((NY - 2, N)) > 0.2
    active = np.flatnonzero(rows).astype(np.int64)
    v = VariableLayout("temp", dims, shape, np.dtype("f8"), 0, active.size, active)
    comps = build_companions(v, halo={"x": H}, cyclic=("x",), level_dim="level",
                             increment="all", also=("tb",))
    v = VariableLayout("temp", dims, shape, np.dtype("f8"), 0, active.size, active,
                       companions=comps)
    layout = StateLayout((v,), active.size)
    for n_tasks in (2, 3, 5):
        cuts = np.sort(rng.choice(np.arange(1, active.size), n_tasks - 1, replace=False))
        bounds = list(zip([0, *cuts.tolist()], [*cuts.tolist(), active.size], strict=True))
        for name in ("temp", "tb"):
            covered = np.zeros(int(np.prod(shape)), dtype=np.int64)
            for t in range(n_tasks):
                r = CompanionPlan(layout, bounds, t).segments[0].ranges[name]
                for lo, hi in zip(r.lo.tolist(), r.hi.tolist(), strict=True):
                    covered[lo:hi] += 1
            assert covered.max() == 1, (name, n_tasks)
            written = set(active.tolist()) if name == "temp" else set()
            for c in comps:
                if c.target == name:
                    written |= set(c.target_elements.tolist())
            assert all(covered[e] for e in written)


# ------------------------------------------------------------------------ the kill
CHILD = """
import sys, numpy as np
from pathlib import Path
sys.path.insert(0, {tests!r})
from companions_support import make_layout
from mpi4py import MPI
from ensio.config.schema import IOSection
from ensio.io.modes.files import FileEnsembleIO
paths = [Path(p) for p in {paths!r}]
ocean = np.load({ocean!r})
with FileEnsembleIO(paths, make_layout(ocean), IOSection(tasks=1), MPI.COMM_SELF) as ens:
    block = ens.read()
    block.data[:] += 1.0
    ens.write(block)
"""


def test_kill_mid_write_rolls_back_rows_and_companions(tmp_path, rng):
    members = write_members(tmp_path, 2, rng)
    np.save(tmp_path / "ocean.npy", members.ocean)
    before = [digest(p) for p in members.paths]
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(Path(__file__).parent),
                                   paths=[str(p) for p in members.paths],
                                   ocean=str(tmp_path / "ocean.npy")))
    count = tmp_path / "count.jsonl"
    env = {**os.environ, "ENSIO_FAULT_COUNT": str(count)}
    subprocess.run([sys.executable, str(script)], check=True, env=env)
    import json

    labels = json.loads(count.read_text().splitlines()[-1])["labels"]
    writes = [i + 1 for i, lab in enumerate(labels) if lab == "data-write"]
    assert len(writes) >= 4  # rows and companion ranges of two variables, two members
    finished = [digest(p) for p in members.paths]
    assert finished != before
    # restore the priors, then kill at a data write drawn at random
    for k in sorted(rng.choice(writes[1:], 2, replace=False).tolist()):
        members = write_members(tmp_path, 2, np.random.default_rng(0))
        np.save(tmp_path / "ocean.npy", members.ocean)
        before = [digest(p) for p in members.paths]
        env = {**os.environ, "ENSIO_FAULT_KILL_AT": str(k)}
        proc = subprocess.run([sys.executable, str(script)], env=env)
        assert proc.returncode == -9
        assert [digest(p) for p in members.paths] != before  # some bytes were written
        assert recover(tmp_path).state == "rolled_back"
        assert [digest(p) for p in members.paths] == before


# ------------------------------------------------- modes that cannot write them
@pytest.mark.parametrize("keys", [
    {"halo": {"x": 2}, "cyclic": ["x"]},
    {"time_level": {"dim": "level", "index": 1, "increment": "all"}},
    {"variables": [{"name": "temp", "also": ["tb"]}]},
])
@pytest.mark.parametrize("where", ["shuffle", "tiled"])
def test_modes_without_companions_refuse_the_config(keys, where):
    """io.mode shuffle and tiled members move whole variables: one ConfigError by key."""
    from ensio.config import config_from_dict
    from ensio.config.schema import ConfigError

    ens = {"members": "m{member:02d}.nc", "size": 2, "dims": list(DIMS),
           "variables": [{"name": "temp"}], **keys}
    d = {"ensemble": ens}
    if where == "shuffle":
        d["io"] = {"mode": "shuffle", "local_dir": "/tmp/x"}
    else:
        ens["members"] = "m{member:02d}_{tile}.nc"
    with pytest.raises(ConfigError, match=r"^ensemble\.\S+: not supported with "):
        config_from_dict(d)
