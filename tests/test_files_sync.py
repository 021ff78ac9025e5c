"""``io.mode: files`` with fewer collectives: what the merged steps must still guarantee.

Each read or write now synchronises the ranks once before (journal recovery
rides on the member check) and once after (errors, counts and seconds in one
exchange); the writer's finiteness checks take one pass. These tests check
the guarantees those steps carry, against the netCDF library's own reading.
"""

from __future__ import annotations

import os

import numpy as np
from cases import EnsembleCase, VarCase, reference_matrix, sha256
from mpi4py import MPI

from ensio.config import config_from_dict
from ensio.io.formats.open import open_member
from ensio.io.modes.ensemble import open_ensemble
from ensio.io.txn.journal import JOURNAL_DIRNAME
from ensio.io.txn.undolog import UndoLog

SELF = MPI.COMM_SELF
SEED = 20251125


def _case(fmt: str = "NETCDF3_64BIT_DATA") -> EnsembleCase:
    return EnsembleCase(members=3, fmt=fmt, seed=SEED,
                        variables=[VarCase("state", ("lat", "lon"), "f8")])


def _crash_midway(root, path, rng) -> None:
    """What a writer killed mid-write leaves: an undo record, then overwritten state bytes."""
    with open_member(path) as store:
        info = store.variables()["state"]
    log = UndoLog.create(root, 7, fsync=False)
    with open(path, "r+b") as f:
        f.seek(info.raw_offset)
        prior = f.read(info.nbytes)
        log.save(path, info.raw_offset, prior)
        f.seek(info.raw_offset)
        f.write(rng.integers(0, 256, info.nbytes, np.uint8).tobytes())
    log.close()


def test_interrupted_write_between_calls_is_undone_before_the_next_read(tmp_path, rng):
    case = _case()
    paths = case.write(tmp_path)
    expected = reference_matrix(paths, case.variables)
    digests = [sha256(p) for p in paths]
    cfg = config_from_dict(case.config(tmp_path))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
        block = ens.read()
        np.testing.assert_array_equal(block.data, expected)
        _crash_midway(tmp_path, paths[1], rng)
        assert sha256(paths[1]) != digests[1]
        again = ens.read(out=block)
        np.testing.assert_array_equal(again.data, expected)
        assert [sha256(p) for p in paths] == digests
        assert not (tmp_path / JOURNAL_DIRNAME).exists()
        # the same before a write: the write lands on the restored file
        _crash_midway(tmp_path, paths[2], rng)
        again.data[...] = -expected
        ens.write(again)
    np.testing.assert_array_equal(reference_matrix(paths, case.variables), -expected)


def test_values_whose_sum_overflows_are_written_exactly(tmp_path, rng):
    """The writer's one-pass finiteness test may say "not all finite" wrongly, never rightly."""
    case = _case("NETCDF4")
    paths = case.write(tmp_path)
    cfg = config_from_dict(case.config(tmp_path))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
        block = ens.read()
        huge = np.where(rng.random(block.data.shape) < 0.5, 1.7e308, 1.5e308)
        block.data[...] = huge
        with np.errstate(over="ignore"):
            assert not np.isfinite(block.data.sum())  # the careful path is taken
        ens.write(block)
    np.testing.assert_array_equal(reference_matrix(paths, case.variables), huge)


def test_a_missing_value_keeps_the_row_in_every_member(tmp_path, rng):
    case = _case()
    paths = case.write(tmp_path)
    prior = reference_matrix(paths, case.variables)
    cfg = config_from_dict(case.config(tmp_path))
    with open_ensemble(cfg.member_paths(), cfg.ensemble, cfg.io, SELF) as ens:
        block = ens.read()
        new = rng.standard_normal(block.data.shape)
        new[1, 5] = np.nan  # member 2, row 5: an analysis that failed there
        block.data[...] = new
        ens.write(block)
    expected = new.copy()
    expected[:, 5] = prior[:, 5]
    np.testing.assert_array_equal(reference_matrix(paths, case.variables), expected)
    assert os.path.exists(paths[0])
