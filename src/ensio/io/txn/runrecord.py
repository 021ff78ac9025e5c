"""The run record: which analyses the member files already hold (exactly once).

``<root>/.ensio-runs.jsonl`` (beside the journal) gets one JSON line per
committed run, written as a staged file of the run's transaction (so it
exists iff the run committed)::

    {"key": "<sha256>", "cycle": 0, "committed": "2024-05-01T12:00:00Z",
     "command": "ensio analyse cfg.yaml",
     "contents": ["<sha256>", ...],
     "members": {"/abs/mem001.nc": "<sha256>", ...},
     "products": {"/abs/mean.nc": "<sha256>", ...}}

An analysis is identified by **what determines it and the contents it left**,
never by paths or the I/O mode. ``key`` hashes the configuration (every
section but ``io``, whose settings do not change the result, except
``io.in_place``), the observation files' contents and the cycle
(:func:`run_key`). ``contents`` holds the sha256 of every file the run read
and wrote *as committed*, in matrix order: member by member (each member's
tiles in tile order), then the copies of ``output.members``. A rerun with
the same key whose files, in that order, still have those hashes would
assimilate the same observations a second time: ``ensio analyse`` says so
and does nothing (``--force`` assimilates again). So a shuffle analysis of
node-local tiles, staged out with ``ensio stage out``, is "already analysed"
for an ``io.mode: files`` run of the global tiles (the same bytes), and the
reverse; a member modified since (another analysis, a new forecast) has
another hash.

``members`` (path → sha256; in ``io.mode: shuffle`` keyed ``host:path``,
since local paths repeat on different hosts) says where the contents were.
Entries written before ``contents`` existed (their key also hashed the
member paths: :func:`path_run_key`) are still recognised by those paths.
A shuffle entry carries ``txid``, because appending it is that run's commit
point (:mod:`ensio.io.txn.shufflecommit`).

Hashing reads every member file once more after the write (from the page
cache, spread over the ranks); the check before a run hashes them only when
the record has an entry with the run's key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ... import faults
from ...config.schema import Config
from ...errors import file_op
from ...parallel.agree import ErrorNote, note_error, rebuild
from ..scan.memberfiles import member_files
from .runsfile import RUNS_NAME, runs_path
from .runsfile import read_entries as _entries

__all__ = ["RUNS_NAME", "file_digests", "find_run", "holds", "path_run_key", "record_line",
           "run_key", "run_keys", "runs_path", "sha256_file", "staged_runs"]

_KEEP = 1000  # lines kept in the record (the newest)


def sha256_file(path: str | Path) -> str:
    """sha256 of a file's bytes (one home for the record's member digests)."""
    with file_op("read", path), open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _determined(config: Config, obs_files: Sequence[Path], cycle: int) -> dict[str, Any]:
    """What determines the analysis: config (without ``io``), observations' contents, cycle."""
    raw = dataclasses.asdict(config)
    raw.pop("io", None)
    raw.pop("workflow", None)
    raw.pop("base_dir", None)  # relative patterns: the same analysis wherever the case is
    raw["in_place"] = config.io.in_place
    # an unreadable file is reported by the observation reader, in its words
    raw["observation_files"] = [sha256_file(p) if os.path.isfile(p) else "" for p in obs_files]
    raw["cycle"] = cycle
    return raw


def _digest(raw: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def run_key(config: Config, obs_files: Sequence[Path], cycle: int) -> str:
    """sha256 of what determines the analysis: config (without ``io``), observations, cycle.

    No paths of member files and no I/O mode: the contents identify the
    members (``contents`` of the entry).
    """
    return _digest(_determined(config, obs_files, cycle))


def path_run_key(config: Config, obs_files: Sequence[Path], cycle: int, *,
                 members: Sequence[Path] | None = None) -> str:
    """The key of entries written before identity by contents: :func:`run_key` plus the
    absolute member paths (``members``: every tile, when the caller knows them)."""
    return run_keys(config, obs_files, cycle, members=members)[1]


def run_keys(config: Config, obs_files: Sequence[Path], cycle: int, *,
             members: Sequence[Path] | None = None) -> tuple[str, str]:
    """(:func:`run_key`, :func:`path_run_key`), the observations hashed once.

    ``members`` are the member files (every tile of a tiled ensemble) when
    the caller knows them already: in ``io.mode: shuffle`` the tile count may
    come from the local copies, and the global tiles need not be readable.
    """
    raw = _determined(config, obs_files, cycle)
    key = _digest(raw)
    if members is None:
        members = member_files(config.ensemble, config.base_dir)
    raw["members"] = [os.path.abspath(p) for p in members]
    return key, _digest(raw)


def file_digests(paths: Sequence[str | Path], comm: MPI.Comm, *,
                 missing_ok: bool = False) -> list[str]:
    """Collective: sha256 of every file (file i on rank i % size), the same list on every rank.

    A file that cannot be read raises on every rank (:class:`FileOpError`),
    or with ``missing_ok`` a missing one hashes to ``""``.
    """
    mine: dict[int, str] = {}
    note: ErrorNote = None
    try:
        for i in range(comm.rank, len(paths), comm.size):
            if missing_ok and not os.path.exists(paths[i]):
                mine[i] = ""
            else:
                mine[i] = sha256_file(paths[i])
    except Exception as exc:  # shared below, so no rank waits in the allgather
        note = note_error(exc)
    merged: dict[int, str] = {}
    parts = comm.allgather((mine, note))
    first = next((n for _, n in parts if n is not None), None)
    if first is not None:
        raise rebuild(first)
    for part, _ in parts:
        merged.update(part)
    return [merged[i] for i in range(len(paths))]


def find_run(root: str | Path, *keys: str) -> dict[str, Any] | None:
    """The newest committed run with one of ``keys`` (:func:`run_keys`), or None."""
    return next((e for e in reversed(_entries(root)) if e.get("key") in keys), None)


def holds(entry: Mapping[str, Any], contents: Sequence[str]) -> bool | None:
    """Whether files of digests ``contents`` (matrix order) hold ``entry``'s analysis.

    None for an entry written before ``contents`` existed: the caller then
    compares its ``members`` by path.
    """
    if "contents" not in entry:
        return None
    return list(entry["contents"]) == list(contents)


def record_line(key: str, cycle: int, command: str, members: Mapping[str, str],
                products: Mapping[str, str], *, txid: str | None = None,
                contents: Sequence[str] | None = None) -> dict[str, Any]:
    """One run's entry (see the module docstring).

    ``contents``: the digests of the files in matrix order (default: those
    of ``members`` in their order). ``txid`` names a shuffle transaction
    (:mod:`ensio.io.txn.shufflecommit`): the entry is its commit point, and
    recovery of a local journal looks for it.
    """
    entry = {"key": key, "cycle": cycle,
             "committed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "command": command, "members": dict(members), "products": dict(products),
             "contents": list(members.values()) if contents is None else list(contents)}
    if txid is not None:
        entry["txid"] = txid
    return entry


def staged_runs(root: str | Path, entry: Mapping[str, Any], staged: Path) -> None:
    """Write the record with ``entry`` appended to ``staged`` (renamed at the commit)."""
    kept = _entries(root)[-(_KEEP - 1):]
    text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in [*kept, entry])
    with file_op("write", runs_path(root)):
        staged.write_text(text)
    faults.point("record-staged")
