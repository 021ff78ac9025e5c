"""Library-path writes into a run's private staged copies, and metadata known from a scan.

Issue 26's timing: an analysis writing its copies (``io.in_place: false``) of chunked,
compressed members (Veros restarts) used to copy every member twice (the staged copy,
then a second copy renamed over it) and to parse each file's HDF5 metadata five times.
These tests pin the shortcuts to the long way: the same bytes, the same errors.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from seeds import draw_seed
from veros_like import write_veros_like

from ensio.errors import InputError
from ensio.io.formats.hdf5 import HDF5Store
from ensio.io.formats.open import open_member
from ensio.io.txn.librarycopy import rewrite_elements

SMALL = {"nx": 8, "ny": 6, "nz": 3}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(draw_seed("test_librarycopy_private"))


def _restart(tmp_path: Path, rng: np.random.Generator) -> Path:
    path = tmp_path / "src.h5"
    write_veros_like(path, seed=int(rng.integers(1 << 31)), tau=int(rng.integers(3)), **SMALL)
    return path


def _new_values(path: Path, rng: np.random.Generator) -> dict[str, tuple[None, np.ndarray]]:
    """New whole-variable values for core/temp and core/salt (some NaN: keep the prior)."""
    out = {}
    with open_member(path) as store:
        for name in ("core/temp", "core/salt"):
            info = store.variables()[name]
            new = store.read_elements(name, 0, info.size) + rng.normal(0, 0.1, info.size)
            new[rng.random(info.size) < 0.1] = np.nan
            out[name] = (None, new)
    return out


def test_private_write_equals_copy_and_rename(tmp_path, rng):
    """private=True writes into the file itself (same inode) the bytes the copy path leaves."""
    src = _restart(tmp_path, rng)
    values = _new_values(src, rng)
    with open_member(src) as store:
        known = {n: store.variables()[n] for n in values}
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    shutil.copyfile(src, a)
    shutil.copyfile(src, b)
    ino_a, ino_b = os.stat(a).st_ino, os.stat(b).st_ino
    rewrite_elements(a, values, None, False)
    rewrite_elements(b, values, None, False, known=known, private=True)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != src.read_bytes()
    assert os.stat(a).st_ino != ino_a  # replaced by a rewritten copy
    assert os.stat(b).st_ino == ino_b  # written in place
    with open_member(b) as store:
        for name, (_, new) in values.items():
            got = store.read_elements(name, 0, new.size)
            keep = np.isnan(new)
            np.testing.assert_array_equal(got[~keep], new[~keep])


def test_private_write_of_unchanged_values_leaves_the_file_untouched(tmp_path, rng):
    src = _restart(tmp_path, rng)
    with open_member(src) as store:
        info = store.variables()["core/temp"]
        same = store.read_elements("core/temp", 0, info.size)
    before, stat = src.read_bytes(), os.stat(src)
    rewrite_elements(src, {"core/temp": (None, same)}, None, False, known={"core/temp": info},
                     private=True)
    assert src.read_bytes() == before
    assert os.stat(src).st_mtime_ns == stat.st_mtime_ns


def test_known_metadata_answers_without_a_parse_and_others_still_resolve(tmp_path, rng,
                                                                        monkeypatch):
    """A store opened with known variables parses only when asked for another one."""
    src = _restart(tmp_path, rng)
    with open_member(src) as store:
        table = dict(store.variables())
    parses = []
    import ensio.io.formats.hdf5 as hdf5_mod

    real = hdf5_mod.read_hdf5_metadata
    monkeypatch.setattr(hdf5_mod, "read_hdf5_metadata",
                        lambda p: parses.append(p) or real(p))
    known = {"core/temp": table["core/temp"]}
    with open_member(src, known=known) as store:
        assert type(store) is HDF5Store
        got = store.read_elements("core/temp", 0, table["core/temp"].size)
        assert not parses
        with open_member(src) as plain:
            np.testing.assert_array_equal(got, plain.read_elements("core/temp", 0, got.size))
        parses.clear()
        salt = store.read_elements("core/salt", 0, 5)  # not known: one parse, then answered
        assert len(parses) == 1 and salt.shape == (5,)
        with pytest.raises(InputError, match="nosuch"):
            store.read_elements("core/nosuch", 0, 1)
