"""The one marker reader/writer and the one roll-forward of io/txn (issue 25 item 2)."""

from __future__ import annotations

import pytest

from ensio.errors import InputError
from ensio.io.node.backupworker import BackupAttempt
from ensio.io.txn import shufflejournal, staging
from ensio.io.txn.marker import read_marker, write_marker
from ensio.io.txn.undolog import COMMITTED_NAME, JournalError, is_committed


def test_marker_absent_empty_written_and_unreadable(tmp_path):
    path = tmp_path / "MARK"
    assert read_marker(path, what="marker", error=JournalError) is None
    path.write_bytes(b"")
    assert read_marker(path, what="marker", error=JournalError) == {}
    write_marker(path, {"txid": "t1", "n": 3}, fsync=False, label="test-marker")
    assert read_marker(path, what="marker", error=JournalError, fields=("txid",)) == {
        "txid": "t1", "n": 3}
    assert not [p for p in tmp_path.iterdir() if p != path]  # no temporary left
    with pytest.raises(JournalError, match=r"MARK: unreadable marker \(no global_root\)"):
        read_marker(path, what="marker", error=JournalError, fields=("txid", "global_root"))
    path.write_text("{torn")
    with pytest.raises(InputError, match=r"MARK: unreadable backup marker.*; keep it"):
        read_marker(path, what="backup marker", error=InputError, hint="; keep it")
    path.write_text("[1, 2]")
    with pytest.raises(JournalError, match="not a JSON object"):
        read_marker(path, what="marker", error=JournalError)


def test_every_marker_goes_through_the_one_reader(tmp_path):
    jdir = tmp_path / "j"
    jdir.mkdir()
    assert not is_committed(jdir)
    (jdir / COMMITTED_NAME).write_bytes(b"")  # the journal's: existence is the decision
    assert is_committed(jdir)
    shuffle = tmp_path / "s"
    shufflejournal.ShuffleMarker("tx", "/g").write(shuffle, fsync=False)
    assert shufflejournal.ShuffleMarker.read(shuffle) == shufflejournal.ShuffleMarker("tx", "/g")
    (shuffle / shufflejournal.MARKER_NAME).write_text('{"txid": "tx"}')
    with pytest.raises(JournalError, match="unreadable shuffle marker.*nothing changed"):
        shufflejournal.ShuffleMarker.read(shuffle)
    backup = tmp_path / "b"
    backup.mkdir()
    assert BackupAttempt.completed(backup) is None
    (backup / "COMPLETE").write_text("not json")
    with pytest.raises(InputError, match="COMPLETE: unreadable marker"):
        BackupAttempt.completed(backup)
    (backup / "COMPLETE").write_text('{"format": "other"}')
    with pytest.raises(InputError, match="not an ensio backup marker"):
        BackupAttempt.completed(backup)


def test_roll_forward_with_and_without_recorded_contents(tmp_path):
    targets = [tmp_path / f"t{i}" for i in range(4)]
    staged = [tmp_path / f".t{i}.staged" for i in range(4)]
    for t, s, body in zip(targets, staged, "abcd", strict=True):
        t.write_text("old")
        s.write_text(body)
    staged[1].unlink()  # renamed by an earlier, interrupted roll-forward
    moved, lost = staging.roll_forward(zip(staged, targets, strict=True), fsync=False)
    assert (moved, lost) == (3, [])
    assert [t.read_text() for t in targets] == ["a", "old", "c", "d"]
    assert not any(s.exists() for s in staged)
    again = staging.roll_forward(zip(staged, targets, strict=True), fsync=False)
    assert again == (0, [])  # idempotent

    recorded = {str(t): body for t, body in zip(targets, "wxyz", strict=True)}
    targets[0].write_text("w")  # already holds its recorded contents: left alone
    staged[1].write_text("x")  # staged file holds them: renamed
    staged[2].write_text("not y")  # neither holds them: lost, nothing renamed
    moved, lost = staging.roll_forward(
        zip(staged, targets, strict=True), fsync=False,
        holds=lambda path, target: open(path).read() == recorded[target])
    assert (moved, lost) == (1, [str(targets[2]), str(targets[3])])
    assert [t.read_text() for t in targets] == ["w", "x", "c", "d"]
    assert staged[2].read_text() == "not y"


def test_one_temporary_name_scheme_made_and_recognised(tmp_path):
    from ensio.durable import temporary_name, temporary_of
    from ensio.io.txn.staging import partial_path

    target = tmp_path / "mem001.nc"
    tmp = temporary_name(target)
    assert tmp.parent == tmp_path and temporary_of(tmp.name)[:2] == ("mem001.nc", "tmp")
    assert temporary_name(target) != tmp  # unique per call
    staged = staging.staged_path(target, "abc123")
    assert temporary_of(staged.name) == ("mem001.nc", "staged", "abc123")
    assert temporary_of(partial_path(target).name) == ("mem001.nc", "partial", "")
    # the names on disk are those of earlier versions: what an older run left is recognised
    for old, kind in ((".mem001.nc.ensio-tmp.4242.0a1b2c3d", "tmp"),
                      (".mem001.nc.ensio-staged.0123456789ab", "staged"),
                      (".mem001.nc.ensio-partial", "partial")):
        assert temporary_of(old)[:2] == ("mem001.nc", kind)
    # a writer's temporary of a staged file belongs to the staged file
    inner = temporary_name(staged)
    assert temporary_of(inner.name)[:2] == (staged.name, "tmp")
    for name in ("mem001.nc", ".hidden", ".ensio-tmp.1", ".mem001.nc.ensio-other.1"):
        assert temporary_of(name) is None
    with pytest.raises(ValueError, match="unknown temporary kind"):
        temporary_name(target, "scratch")
    # remove_temporaries removes exactly the writers' temporaries of one file
    keep = [target, staged, tmp_path / ".mem002.nc.ensio-tmp.1.ff", partial_path(target)]
    gone = [temporary_name(target), tmp_path / ".mem001.nc.ensio-tmp.77.00ff00ff"]
    for p in keep + gone:
        p.write_text("x")
    staging.remove_temporaries(target)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in gone)
