"""``ensio stage in|out``: placement, verified atomic copies, idempotence, bad input, kills."""

from __future__ import annotations

import json
import os
import signal

import pytest
from mpi4py import MPI
from stage_support import ensio, make_case, make_dirs, sha, temporaries, tree

from ensio.config.errors import ConfigError
from ensio.config.load import config_from_dict
from ensio.errors import InputError
from ensio.io.node.placemap import place_files
from ensio.io.node.placenode import place_ensemble
from ensio.io.txn.journal import JOURNAL_DIRNAME

SELF = MPI.COMM_SELF
HOST = "nodeA"


def staged(case, direction, **kw):
    return place_ensemble(case.config, direction, SELF, host=HOST, **kw)


@pytest.mark.parametrize("n_ranks", [6, 4, 1, 9])
def test_placement_follows_the_documented_rule(tmp_path, rng, n_ranks):
    case = make_case(tmp_path, rng)
    hosts = [f"h{r % 2}" for r in range(n_ranks)]
    placed = place_files(case.config, hosts)
    assert len(placed) == 6
    for p in placed:
        f = (p.member - 1) * 2 + p.tile
        assert p.rank == f % n_ranks and p.host == hosts[p.rank]
        assert p.local == case.expected_local(p.member, p.tile, n_ranks, hosts[p.rank])
        assert p.global_path == case.files[p.member, p.tile]
        assert p.rel == p.global_path.name  # all files in one directory
    if n_ranks == 6:  # shuffle mode: rank m*P + p holds tile p of member m
        assert [(p.rank, p.member, p.tile) for p in placed] == [
            (m * 2 + t, m + 1, t) for m in range(3) for t in range(2)]


def test_untiled_members_with_one_local_name_collide_without_rank(tmp_path):
    raw = {"ensemble": {"members": "mem{member:03d}/restart.nc", "size": 2, "variables": ["x"]},
           "io": {"local_dir": "local/{host}"}}
    config = config_from_dict(raw, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^io.local_dir: .*restart.nc"):
        place_files(config, ["h", "h"])
    placed = place_files(config, ["h", "h2"])  # one per host: no collision
    assert [p.rel for p in placed] == ["mem001/restart.nc", "mem002/restart.nc"]


def test_bad_local_dir_pattern_names_the_key(tmp_path, rng):
    case = make_case(tmp_path, rng, local="local/{node}")
    with pytest.raises(ConfigError, match=r"^io.local_dir: pattern"):
        place_files(case.config, ["h"])


def test_backup_dir_needs_cycle(tmp_path, rng):
    with pytest.raises(ConfigError, match=r"^io.backup_dir: .*\{cycle\}"):
        make_case(tmp_path, rng, backup="backup/x")


def test_stage_in_out_round_trip_and_idempotent(tmp_path, rng):
    case = make_case(tmp_path, rng)
    make_dirs(case.local_dirs(6, [HOST] * 6))
    report = staged(case, "in")
    assert (report.files, report.copied, report.skipped) == (6, 6, 0)
    assert report.bytes == sum(p.stat().st_size for p in case.files.values())
    for (m, t), g in case.files.items():
        local = case.expected_local(m, t, 6, HOST)
        assert local.read_bytes() == g.read_bytes()
    again = staged(case, "in")
    assert (again.copied, again.skipped) == (0, 6)
    # the analysis changes two local tiles (one grows); stage out brings exactly those back
    changed = {(1, 1): b"new tile" * 100, (3, 0): b"other"}
    for key, data in changed.items():
        case.expected_local(*key, 6, HOST).write_bytes(data)
    out = staged(case, "out")
    assert (out.copied, out.skipped) == (2, 4)
    for key, g in case.files.items():
        assert g.read_bytes() == case.expected_local(*key, 6, HOST).read_bytes()
    assert staged(case, "out").copied == 0
    assert not temporaries(tmp_path)


def test_checksum_copies_what_size_and_time_miss(tmp_path, rng):
    case = make_case(tmp_path, rng)
    make_dirs(case.local_dirs(6, [HOST] * 6))
    staged(case, "in")
    local = case.expected_local(2, 0, 6, HOST)
    st = local.stat()
    data = bytearray(local.read_bytes())
    data[17] ^= 0xFF  # same size ...
    local.write_bytes(bytes(data))
    os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and same time
    assert staged(case, "in").copied == 0  # the quick check cannot see it
    assert staged(case, "in", checksum=True).copied == 1
    assert sha(local) == sha(case.files[2, 0])


def test_fewer_ranks_round_robin(tmp_path, rng):
    case = make_case(tmp_path, rng)
    make_dirs(case.local_dirs(4, [HOST] * 4))
    assert staged(case, "in", n_ranks=4).copied == 6
    for (m, t), g in case.files.items():
        assert case.expected_local(m, t, 4, HOST).read_bytes() == g.read_bytes()


@pytest.mark.parametrize("direction", ["in", "out"])
def test_missing_local_dir_of_one_rank_modifies_nothing(tmp_path, rng, direction):
    case = make_case(tmp_path, rng)
    dirs = case.local_dirs(6, [HOST] * 6)
    make_dirs(dirs)
    if direction == "out":
        staged(case, "in")
        for key in case.files:  # the analysis wrote every local tile
            case.expected_local(*key, 6, HOST).write_bytes(rng.bytes(100))
    dirs[4].rename(dirs[4].with_name("gone"))
    before = tree(tmp_path)
    with pytest.raises(InputError, match=rf"^{dirs[4]}: local directory \(io.local_dir\) "
                                         rf"does not exist \(rank 4 on host {HOST}\)"):
        staged(case, direction)
    assert tree(tmp_path) == before


def test_missing_member_file_modifies_nothing(tmp_path, rng):
    case = make_case(tmp_path, rng)
    make_dirs(case.local_dirs(6, [HOST] * 6))
    case.files[3, 1].unlink()
    before = tree(tmp_path)
    with pytest.raises(InputError, match=r"mem003_0001.nc: not found \(member 3 tile 1, rank 5\)"):
        staged(case, "in")
    assert tree(tmp_path) == before


def test_refuses_beside_an_undo_journal(tmp_path, rng):
    case = make_case(tmp_path, rng)
    dirs = case.local_dirs(6, [HOST] * 6)
    make_dirs(dirs)
    (dirs[2] / JOURNAL_DIRNAME).mkdir()
    before = tree(tmp_path)
    with pytest.raises(InputError, match=r"undo journal .*; run .ensio recover "):
        staged(case, "in")
    assert tree(tmp_path) == before


def test_cli_one_line_error_and_success(tmp_path, rng):
    case = make_case(tmp_path, rng)
    cfg = tmp_path / "ensio.yaml"
    cfg.write_text(json.dumps({
        "ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": 3,
                     "variables": ["x"], "tiles": {"count": 2, "layout": [2, 1]}},
        "io": {"local_dir": "local/{host}/r{rank:02d}"}}))
    env = {"ENSIO_HOST": HOST}
    bad = ensio("stage", "in", str(cfg), env_extra=env)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "local directory (io.local_dir)" in bad.stderr
    make_dirs(case.local_dirs(6, [HOST] * 6))
    ok = ensio("stage", "in", str(cfg), "--checksum", env_extra=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("stage in: 6 files on 1 node(s): 6 copied")


def _fault_labels(cfg, tmp_path, env):
    count = tmp_path / "count.jsonl"
    run = ensio("stage", "in", str(cfg), env_extra=env | {"ENSIO_FAULT_COUNT": str(count)})
    assert run.returncode == 0, run.stderr
    labels = json.loads(count.read_text().splitlines()[0])["labels"]
    count.unlink()
    return labels


def test_kill_during_stage_in_leaves_old_or_new_and_rerun_finishes(tmp_path, rng):
    """SIGKILL at every kind of step: each local file is absent, its old or its new content."""
    case = make_case(tmp_path / "case", rng)
    cfg = tmp_path / "case" / "ensio.yaml"
    cfg.write_text(json.dumps({
        "ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": 3,
                     "variables": ["x"], "tiles": {"count": 2, "layout": [2, 1]}},
        "io": {"local_dir": "local/{host}/r{rank:02d}"}}))
    env = {"ENSIO_HOST": HOST}
    dirs = case.local_dirs(6, [HOST] * 6)
    make_dirs(dirs)
    locals_ = {k: case.expected_local(*k, 6, HOST) for k in case.files}
    old = {k: rng.bytes(int(rng.integers(10, 2000))) for k in case.files}

    def reset():
        for k, p in locals_.items():
            p.write_bytes(old[k])
        for t in temporaries(tmp_path):
            t.unlink()

    reset()
    labels = _fault_labels(cfg, tmp_path, env)
    assert {"stage-in-written", "stage-in-synced", "stage-in-renamed"} <= set(labels)
    ks = {1, len(labels)} | set(rng.integers(1, len(labels) + 1, 8).tolist())
    for k in sorted(ks):
        reset()
        run = ensio("stage", "in", str(cfg), env_extra=env | {"ENSIO_FAULT_KILL_AT": str(k)})
        assert run.returncode == -signal.SIGKILL, (k, run.stderr)
        for key, p in locals_.items():
            assert p.read_bytes() in (old[key], case.files[key].read_bytes()), (k, key)
        rerun = ensio("stage", "in", str(cfg), env_extra=env)
        assert rerun.returncode == 0, rerun.stderr
        assert all(p.read_bytes() == case.files[k2].read_bytes() for k2, p in locals_.items())
        assert not temporaries(tmp_path), k


def test_ranks_option_rejects_nonsense(tmp_path, rng):
    case = make_case(tmp_path, rng)
    with pytest.raises(ConfigError, match="--ranks"):
        staged(case, "in", n_ranks=0)

