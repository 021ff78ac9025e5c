"""``ensio recover``'s line says what it really did (issue 25, item 8).

A library-path rewrite journals the whole prior file, not byte ranges; its
roll back used to print "rolled back 0 ranges (135.0 kB)". The line now names
ranges written back and whole files put back apart, and a journal with
nothing to undo says so. Each check restores the prior bytes too.
"""

from __future__ import annotations

import argparse
import hashlib
import os

from ensio.cli import recover as recover_cli
from ensio.io.txn.undolog import UndoLog


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ensio")
    recover_cli.add_parser(parser.add_subparsers(dest="command"))
    return recover_cli.run(parser.parse_args(argv))


def _rewrite(path, rng, size: int) -> None:
    """The library path: the whole file replaced by a rewritten copy."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(rng.integers(0, 256, size, "u1").tobytes())
    os.replace(tmp, path)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_whole_files_are_not_called_ranges(tmp_path, rng, capsys) -> None:
    a = tmp_path / "a.nc"
    a.write_bytes(rng.integers(0, 256, 135_000, "u1").tobytes())
    prior = _sha(a)
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        log.save_file(a)
        _rewrite(a, rng, 140_000)
    assert run_cli(["recover", "--no-fsync", str(tmp_path)]) == 0
    assert capsys.readouterr().out == \
        "recovered: put back the prior copy of 1 whole file (135.0 kB)\n"
    assert _sha(a) == prior


def test_ranges_and_whole_files_together(tmp_path, rng, capsys) -> None:
    a, b = tmp_path / "a.nc", tmp_path / "b.nc"
    for p in (a, b):
        p.write_bytes(rng.integers(0, 256, 2000, "u1").tobytes())
    prior = [_sha(a), _sha(b)]
    with UndoLog.create(tmp_path, 0, fsync=False) as log:
        log.save_file(a)
        _rewrite(a, rng, 2100)
        for off in (10, 500):
            log.save(b, off, b.read_bytes()[off : off + 16])
            with open(b, "r+b") as f:
                f.seek(off)
                f.write(b"x" * 16)
    assert run_cli(["recover", "--no-fsync", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ("recovered: rolled back 2 ranges and put back the "
                                       "prior copy of 1 whole file (2.0 kB) in 2 files\n")
    assert [_sha(a), _sha(b)] == prior


def test_nothing_to_undo_says_so(tmp_path, capsys) -> None:
    UndoLog.create(tmp_path, 0, fsync=False).close()
    assert run_cli(["recover", "--no-fsync", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out == "recovered: rolled back nothing (no prior bytes had been saved)\n"
    assert not any(tmp_path.iterdir())
