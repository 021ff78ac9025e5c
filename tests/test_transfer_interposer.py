"""POSIX behaviour of transferred files seen by a program under the interposer.

Descriptor copies (dup), reopens by the producer, writes that keep content (a new
version), relative and directory-relative paths, rename and unlink, O_EXCL, stdio
(fopen/fclose), fork, threads, a normal exit with a file still open, and the consumer's
read-only view. Each expectation is what a file system would give, checked by reading
the result from a separate consumer process.
"""

from __future__ import annotations

import json
import select
import sys

import pytest
from transfer_support import (  # noqa: F401  (the *_fixture names are fixtures)
    Host,
    host_fixture,
    interposer_cache_fixture,
    wait_for,
    write_config,
)

PY = sys.executable

PRODUCER = r"""
import ctypes, errno, json, os, sys, threading
d = sys.argv[1]
res = {}
# a dup outlives the descriptor the program opened: the file completes at the last close
fd = os.open(f"{d}/mem001.nc", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o640)
os.write(fd, b"part1-")
fd2 = os.dup(fd)
os.close(fd)
os.write(fd2, b"part2")
with open(f"{d}/mem001.nc", "rb") as f:  # the producer reads what it is writing
    res["while_writing"] = f.read().decode()
st = os.stat(f"{d}/mem001.nc")
res["stat_writing"] = [st.st_size, st.st_mode & 0o7777]
os.close(fd2)
with open(f"{d}/mem001.nc", "rb") as f:
    res["reread"] = f.read().decode()
with open(f"{d}/mem001.nc", "r+b") as f:  # no O_TRUNC: a new version starting from the old
    f.write(b"PART1")
# relative and directory-relative names
os.chdir(d)
with open("mem002.nc", "wb") as f:
    f.write(b"relative")
dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
fd = os.open("mem003.nc", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd)
os.write(fd, b"dirfd")
os.close(fd)
with open("sub/../mem_tmp.nc", "wb") as f:
    f.write(b"renamed")
os.rename("mem_tmp.nc", "mem004.nc")
with open("mem005.nc", "wb") as f:
    f.write(b"exported")
os.rename("mem005.nc", "exported.dat")
os.unlink("mem003.nc")
res["after_unlink"] = os.path.exists("mem003.nc")
try:
    os.open("mem002.nc", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
except FileExistsError:
    res["excl"] = "EEXIST"
try:
    os.open("mem404.nc", os.O_RDONLY)
except FileNotFoundError:
    res["absent"] = "ENOENT"
# stdio
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fwrite.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
fp = libc.fopen(b"mem006.nc", b"w")
libc.fwrite(b"stdio", 1, 5, fp)
res["fclose"] = libc.fclose(fp)
# fork: the child writes its own file
pid = os.fork()
if pid == 0:
    with open("mem007.nc", "wb") as f:
        f.write(b"child")
    os._exit(0)
os.waitpid(pid, 0)
# threads: each writes its own file and reads it back
def work(i):
    data = bytes([i]) * (10000 + i)
    with open(f"mem1{i:02d}.nc", "wb") as f:
        f.write(data)
    with open(f"mem1{i:02d}.nc", "rb") as f:
        assert f.read() == data
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(res, sort_keys=True))
"""

UNCLOSED = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, b"never closed, but the program exits normally")
sys.exit(0)
"""

CONSUMER = r"""
import errno, json, os, sys
d = sys.argv[1]
out = {}
for name in sorted(os.listdir(d)) + [f"mem{i:03d}.nc" for i in range(1, 8)]:
    p = f"{d}/{name}"
    try:
        with open(p, "rb") as f:
            out[name] = f.read().decode()
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
for i in range(8):
    with open(f"{d}/mem1{i:02d}.nc", "rb") as f:
        out[f"mem1{i:02d}.nc"] = f.read() == bytes([i]) * (10000 + i)
st = os.stat(f"{d}/mem001.nc")
out["mode"] = st.st_mode & 0o7777
out["access_w"] = os.access(f"{d}/mem001.nc", os.W_OK)
try:
    open(f"{d}/mem001.nc", "r+b")
except OSError as exc:
    out["write"] = errno.errorcode[exc.errno]
print(json.dumps(out, sort_keys=True))
"""


@pytest.fixture
def setup(host: Host):
    fc = host.work / "fc"
    (fc / "sub").mkdir(parents=True)
    return host, fc, write_config(host.work / "t.yaml", [str(fc / "mem*.nc")])


def test_posix_behaviour_of_transferred_files(setup):
    host, fc, config = setup
    p = host.run(config, "model", PY, "-c", PRODUCER, str(fc))
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res == {"while_writing": "part1-part2", "stat_writing": [11, 0o640],
                   "reread": "part1-part2", "after_unlink": False, "excl": "EEXIST",
                   "absent": "ENOENT", "fclose": 0}
    assert sorted(x.name for x in fc.iterdir()) == ["exported.dat", "sub"]
    c = host.run(config, "post", PY, "-c", CONSUMER, str(fc))
    assert c.returncode == 0, c.stderr
    got = json.loads(c.stdout)
    assert got == {
        "exported.dat": "exported", "sub": "EISDIR",
        "mem001.nc": "PART1-part2", "mem002.nc": "relative", "mem003.nc": "ENOENT",
        "mem004.nc": "renamed", "mem005.nc": "ENOENT", "mem006.nc": "stdio",
        "mem007.nc": "child", **{f"mem1{i:02d}.nc": True for i in range(8)},
        "mode": 0o640, "access_w": False, "write": "EROFS"}
    held = {s.path: s.state for s in host.status()}
    assert held[str(fc / "mem004.nc")] == "complete" and str(fc / "mem003.nc") not in held


def test_a_normal_exit_completes_a_file_left_open(setup):
    host, fc, config = setup
    p = host.run(config, "model", PY, "-c", UNCLOSED, str(fc / "mem001.nc"))
    assert p.returncode == 0, p.stderr
    [st] = host.status()
    assert st.state == "complete"
    c = host.run(config, "post", "cat", str(fc / "mem001.nc"))
    assert c.stdout == "never closed, but the program exits normally"


HOLD = r"""
import sys
f = open(sys.argv[1], "wb")
f.write(b"first half, ")
f.flush()
print("written", flush=True)
sys.stdin.readline()
f.write(b"second half")
f.close()
"""

TWO_THREADS = r"""
import os, sys, threading
d = sys.argv[1]
def slow():
    with open(f"{d}/mem001.nc", "rb") as f:  # still being written: this thread waits
        print("A " + f.read().decode(), flush=True)
t = threading.Thread(target=slow)
t.start()
sys.stdin.readline()  # the test saw A waiting
with open(f"{d}/mem002.nc", "rb") as f:  # complete: must not queue behind A's wait
    print("B " + f.read().decode() + " " + str(os.stat(f"{d}/mem002.nc").st_size), flush=True)
t.join()
"""


def test_a_waiting_open_does_not_hold_up_other_threads(setup):
    host, fc, config = setup
    assert host.run(config, "model", "sh", "-c", f"printf ready > {fc}/mem002.nc").returncode == 0
    prod = host.start(config, "model", PY, "-c", HOLD, str(fc / "mem001.nc"))
    assert prod.stdout.readline() == "written\n"
    cons = host.start(config, "post", PY, "-c", TWO_THREADS, str(fc))
    wait_for(lambda: [s.waiters for s in host.status()] == [1, 0], what="thread A waiting")
    cons.stdin.write("go\n")
    cons.stdin.flush()
    ready, _, _ = select.select([cons.stdout], [], [], 60)
    assert ready and cons.stdout.readline() == "B ready 5\n"
    prod.communicate("go\n", timeout=60)
    out, err = cons.communicate(timeout=60)
    assert cons.returncode == 0, err
    assert out == "A first half, second half\n"


REPLACER = r"""
import json, os, sys
from ensio.durable import replacing
d = sys.argv[1]
res = {}
for text in ("first", "second"):  # the second replaces a held file: its bits are copied
    with replacing(f"{d}/mem008.nc") as tmp:
        with open(tmp, "w") as f:
            f.write(text)
    if text == "first":
        os.chmod(f"{d}/mem008.nc", 0o604)
        res["after_chmod"] = os.stat(f"{d}/mem008.nc").st_mode & 0o7777
res["after_replace"] = os.stat(f"{d}/mem008.nc").st_mode & 0o7777
print(json.dumps(res, sort_keys=True))
"""


def test_chmod_of_a_held_file_and_replacing_it(setup):
    """``chmod`` by path of a file in memory changes the bits ``stat`` answers (and the
    disk gets); an atomic-rename writer that copies the old file's bits onto its
    temporary file (``durable.replacing``, ``cp -p``) works on transferred names."""
    host, fc, _ = setup
    # the temporary sibling (.mem008.nc.ensio-tmp.*) is transferred too
    config = write_config(host.work / "t2.yaml", [str(fc / "*mem*.nc*")])
    p = host.run(config, "model", PY, "-c", REPLACER, str(fc))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"after_chmod": 0o604, "after_replace": 0o604}
    assert not (fc / "mem008.nc").exists()
    c = host.run(config, "post", "cat", str(fc / "mem008.nc"))
    assert c.stdout == "second"
