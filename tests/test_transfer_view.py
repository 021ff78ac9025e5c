"""Issue 28 items 1 and 3: consumers that start first, and the file-system view of
transferred files, with unmodified tools.

Item 1: a consumer started before its producer waits for the file (open, and stat:
ncks stats first) up to ``consumer_timeout_s``; the daemon's log line proves it waits
before the producer starts (never a sleep as synchronisation). Then ETIMEDOUT, logged
naming the file and the connection.

Item 3: ``ls -l``, shell wildcards, ``glob``/``os.listdir``/``find``, CDO's globbing,
and a C program calling getdents64/scandir/wordexp/*xattr directly see the held files
beside the real ones, with their size; none of them is on disk.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import pytest
import seeds
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    interposer_cache_fixture,
    wait_for,
    write_config,
)

pytestmark = needs.tools_mark("ncgen", "ncdump", "ncks", "cdo")  # netcdf-bin, nco, cdo

MEMBER_CDL = "netcdf m {{ dimensions: x = 5 ; variables: double v(x) ; data: v = {values} ; }}\n"


def _member(work: Path, name: str, values: list[float]) -> Path:
    cdl = work / f"{name}.cdl"
    cdl.write_text(MEMBER_CDL.format(values=", ".join(repr(v) for v in values)))
    return cdl


def _produce(host: Host, cfg: Path, members: dict[str, list[float]]) -> None:
    """One producer run writing out/<name> for each member (netCDF-4)."""
    script = "; ".join(f"ncgen -4 -o out/{name} {_member(host.work, name, vals).name}"
                       for name, vals in members.items())
    r = host.run(cfg, "model", "sh", "-c", script)
    assert r.returncode == 0, r.stderr


def _waiting_logged(host: Host, path: Path) -> bool:
    return f"{path}: consumer post" in host.log() and "waits for it to be produced" in host.log()


@pytest.mark.parametrize("tool,gap_s", [("ncks", 3.0), ("ncdump", 0.0)])
def test_a_consumer_started_before_its_producer_reads_the_file(host: Host, tool: str,
                                                               gap_s: float) -> None:
    """Started first, the consumer waits (logged), still waits ``gap_s`` later, and then
    reads what the producer writes; nothing reaches the disk."""
    cfg = write_config(host.work / "t.yaml", ["out/*.nc"], consumer_timeout_s=60)
    (host.work / "out").mkdir()
    target = host.work / "out" / "late.nc"
    argv = ["ncks", "-H", "-v", "v", "out/late.nc"] if tool == "ncks" else \
        ["ncdump", "-v", "v", "out/late.nc"]
    consumer = host.start(cfg, "post", *argv)
    try:
        wait_for(lambda: _waiting_logged(host, target), what="the consumer's wait in the log")
        if gap_s:
            with pytest.raises(subprocess.TimeoutExpired):
                consumer.wait(timeout=gap_s)  # still waiting: it was not told ENOENT
        assert consumer.poll() is None
        _produce(host, cfg, {"late.nc": [1.5, 2.5, 3.5, 4.5, 5.5]})
        out, err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, err
    assert re.findall(r"\d+\.5", out.split("v =")[-1] if "v =" in out else out) == \
        ["1.5", "2.5", "3.5", "4.5", "5.5"]
    assert f"{target}: produced, consumer post" in host.log()
    assert not target.exists()


def test_a_consumer_times_out_with_one_line_naming_file_and_connection(host: Host) -> None:
    cfg = write_config(host.work / "t.yaml", ["out/*.nc"], consumer_timeout_s=1)
    (host.work / "out").mkdir()
    r = host.run(cfg, "post", "ncdump", "-h", "out/never.nc")
    assert r.returncode != 0
    assert "Connection timed out" in r.stderr  # ETIMEDOUT, as the program reports it
    said = [x for x in r.stderr.splitlines() if x.startswith("ensio-transfer")]
    assert len(said) == 1 and "out/never.nc" in said[0] and "connection restarts" in said[0]
    lines = [x for x in host.log().splitlines() if "ETIMEDOUT" in x]
    assert len(lines) == 1, host.log()
    assert str(host.work / "out" / "never.nc") in lines[0]
    assert "connection restarts" in lines[0] and "never produced" in lines[0]


def test_a_real_file_written_meanwhile_ends_the_wait(host: Host) -> None:
    """A producer outside the transfer (or a fallback) writes the real file: the waiting
    consumer reads it."""
    cfg = write_config(host.work / "t.yaml", ["out/*.txt"], consumer_timeout_s=60)
    (host.work / "out").mkdir()
    target = host.work / "out" / "plain.txt"
    consumer = host.start(cfg, "post", "cat", "out/plain.txt")
    try:
        wait_for(lambda: _waiting_logged(host, target), what="the consumer's wait in the log")
        tmp = target.with_suffix(".tmp")
        tmp.write_text("written without ensio\n")
        tmp.rename(target)
        out, err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, err
    assert out == "written without ensio\n"


def test_a_name_on_disk_or_of_a_producer_is_not_waited_for(host: Host) -> None:
    """No wait for a real file, nor in a component that produces the connection itself
    (it would wait for itself): ENOENT at once there."""
    cfg = write_config(host.work / "t.yaml", ["out/*.txt"], consumer_timeout_s=60)
    (host.work / "out").mkdir()
    (host.work / "out" / "disk.txt").write_text("on disk\n")
    r = host.run(cfg, "post", "cat", "out/disk.txt", timeout=30)
    assert (r.returncode, r.stdout) == (0, "on disk\n"), r.stderr
    r = host.run(cfg, "model", "cat", "out/absent.txt", timeout=30)
    assert r.returncode != 0 and "No such file" in r.stderr
    assert "waits for it" not in host.log()


def _members(label: str) -> dict[str, list[float]]:
    rng = random.Random(seeds.draw_seed(label))
    return {f"mem00{i}.nc": [round(rng.uniform(-50, 50), 3) for _ in range(5)]
            for i in (1, 2, 3)}


def _reference_size(host: Host, name: str, values: list[float]) -> int:
    """The size ncgen gives the same member written as a plain file."""
    ref = host.work / "ref" / name
    ref.parent.mkdir(exist_ok=True)
    subprocess.run(["ncgen", "-4", "-o", str(ref), str(_member(host.work, "ref-" + name,
                                                                 values))], check=True)
    return ref.stat().st_size


def test_ls_l_and_wildcards_list_the_held_files(host: Host) -> None:
    cfg = write_config(host.work / "t.yaml", ["out/mem*.nc"])
    (host.work / "out").mkdir()
    (host.work / "out" / "notes.txt").write_text("real\n")
    members = _members("test_ls_l_and_wildcards_list_the_held_files")
    _produce(host, cfg, members)
    sizes = {n: _reference_size(host, n, v) for n, v in members.items()}
    r = host.run(cfg, "post", "ls", "-l", "out", "out/mem002.nc")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    listed = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0].startswith("-"):
            listed.setdefault(f[-1], int(f[4]))
    assert listed == {**sizes, "notes.txt": 5, "out/mem002.nc": sizes["mem002.nc"]}
    script = ("import glob, json, os, subprocess; print(json.dumps({"
              "'glob': sorted(glob.glob('out/mem*.nc')), 'listdir': sorted(os.listdir('out')),"
              "'find': sorted(subprocess.run(['find', 'out', '-name', 'mem*'], text=True,"
              " capture_output=True).stdout.split()),"
              "'sh': subprocess.run('echo out/mem00[13].nc', shell=True, text=True,"
              " capture_output=True).stdout.split()}))")
    r = host.run(cfg, "post", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    names = sorted(members)
    assert json.loads(r.stdout) == {
        "glob": [f"out/{n}" for n in names], "listdir": sorted([*names, "notes.txt"]),
        "find": [f"out/{n}" for n in names], "sh": ["out/mem001.nc", "out/mem003.nc"]}
    assert sorted(p.name for p in (host.work / "out").iterdir()) == ["notes.txt"]


def test_cdo_ensmean_of_a_wildcard_reads_the_held_members(host: Host) -> None:
    cfg = write_config(host.work / "t.yaml", ["out/mem*.nc"])
    (host.work / "out").mkdir()
    members = _members("test_cdo_ensmean_of_a_wildcard_reads_the_held_members")
    _produce(host, cfg, members)
    r = host.run(cfg, "post", "cdo", "-s", "-f", "nc", "ensmean", "out/mem00[1-3].nc", "ens.nc")
    assert r.returncode == 0, r.stderr
    dump = subprocess.run(["ncdump", "-p", "15", "-v", "v", str(host.work / "ens.nc")],
                          capture_output=True, text=True, check=True).stdout
    got = [float(x) for x in dump.split("v =")[-1].strip(" ;}\n").replace("\n", " ").split(",")]
    rows = list(members.values())
    expected = [sum(col) / len(col) for col in zip(*rows, strict=True)]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


LISTER = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <wordexp.h>
int main(int argc, char **argv)
{
    char buf[96];  /* a few entries per getdents64 call */
    int fd = open(argv[1], O_RDONLY | O_DIRECTORY);
    printf("getdents");
    for (ssize_t n; (n = getdents64(fd, buf, sizeof buf)) > 0;)
        for (ssize_t off = 0; off < n; off += ((struct dirent64 *)(buf + off))->d_reclen)
            printf(" %s", ((struct dirent64 *)(buf + off))->d_name);
    struct dirent **list;
    int n = scandir(argv[1], &list, NULL, alphasort);
    printf("\nscandir");
    for (int i = 0; i < n; i++) printf(" %s", list[i]->d_name);
    wordexp_t w;
    printf("\nwordexp");
    if (wordexp(argv[2], &w, 0) == 0)
        for (size_t i = 0; i < w.we_wordc; i++) printf(" %s", w.we_wordv[i]);
    char v[64];
    ssize_t g = lgetxattr(argv[3], "user.x", v, sizeof v);
    int ge = errno;
    ssize_t l = listxattr(argv[3], v, sizeof v);
    int s = setxattr(argv[3], "user.x", "1", 1, 0);
    printf("\nxattr %zd %d %zd %d %d\n", g, ge, l, s, errno);
    return 0;
}
"""


def test_c_getdents64_scandir_wordexp_and_xattrs(host: Host) -> None:
    import errno

    cc = shutil.which("cc") or shutil.which("gcc")
    needs.capability("a C compiler", None if cc else "no cc nor gcc")
    exe = host.work / "lister"
    (host.work / "lister.c").write_text(LISTER)
    subprocess.run([str(cc), "-O", "-o", str(exe), str(host.work / "lister.c")], check=True)
    cfg = write_config(host.work / "t.yaml", ["out/mem*.nc"])
    (host.work / "out").mkdir()
    (host.work / "out" / "real.txt").write_text("x")
    (host.work / "out" / "mem003.nc").write_text("stale real file, shadowed")
    members = _members("test_c_getdents64_scandir_wordexp_and_xattrs")
    _produce(host, cfg, members)
    r = host.run(cfg, "post", str(exe), "out", "out/mem00[12].nc x out/real*", "out/mem001.nc")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    every = sorted([".", "..", "mem001.nc", "mem002.nc", "mem003.nc", "real.txt"])
    assert sorted(lines["getdents"].split()) == every  # mem003.nc once
    assert lines["scandir"].split() == every
    assert lines["wordexp"].split() == ["out/mem001.nc", "out/mem002.nc", "x", "out/real.txt"]
    assert lines["xattr"].split() == ["-1", str(errno.ENODATA), "0", "-1", str(errno.ENOTSUP)]


def test_after_a_finished_producer_enoent_at_once_and_the_next_round_waits(host: Host) -> None:
    """Round 1: the producer ran and ended, so a name it did not write is ENOENT at once
    (also after another program of the same consumer run ended). That consumer run ends;
    round 2's consumer, started before round 2's producer, waits again."""
    cfg = write_config(host.work / "t.yaml", ["out/*.txt"], consumer_timeout_s=60)
    (host.work / "out").mkdir()
    assert host.run(cfg, "model", "sh", "-c", "echo one > out/a.txt").returncode == 0
    # bash keeps its own environ; the first cat's end is not the end of post's run
    r = host.run(cfg, "post", "bash", "-c", "cat out/a.txt; cat out/b.txt; true", timeout=30)
    assert (r.returncode, r.stdout) == (0, "one\n") and "No such file" in r.stderr, r.stderr
    assert "unreachable" not in r.stderr
    assert "waits for it" not in host.log()
    target = host.work / "out" / "c.txt"
    consumer = host.start(cfg, "post", "cat", "out/c.txt")
    try:
        wait_for(lambda: _waiting_logged(host, target), what="round 2's consumer waiting")
        assert host.run(cfg, "model", "sh", "-c", "echo two > out/c.txt").returncode == 0
        out, err = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert (consumer.returncode, out) == (0, "two\n"), err
