"""Consumers that map a held file instead of reading it (issue 28 item 6: ``mmap``).

A consumer under ``ensio run`` gets a read-only descriptor of the daemon's memory, so
``mmap`` maps that memory itself: no copy, and nothing of ensio in the way once the
open returned. Checked for both kinds of memory (memfds in 4 KiB pages, and the
huge-page tmpfs where the machine allows it), with an unmodified Python program that
maps the file three ways: ``mmap`` read-only, ``mmap`` copy-on-write (a private
writable mapping, allowed on a sealed file, whose writes stay in the process), and
``numpy.memmap`` of the data behind a 4 KiB header. Each must see exactly the bytes
the producer wrote, the copy-on-write mapping's write must not reach the held file (a
second consumer still reads the original), and the files must stay off the disk.
"""

from __future__ import annotations

import hashlib
import sys

import needs
import numpy as np
import pytest
from seeds import draw_seed
from transfer_support import Host, host_fixture, interposer_cache_fixture, write_config  # noqa: F401

from ensio.transfer.hugemem import thp_available

MIB = 1 << 20
HEADER = 4096

PRODUCER = r"""
import sys
with open(sys.argv[1], "wb") as f:
    f.write(sys.stdin.buffer.read())
"""

CONSUMER = r"""
import hashlib, mmap, os, sys
import numpy as np
path, header = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
    shared = hashlib.sha256(m).hexdigest()
with mmap.mmap(fd, size, access=mmap.ACCESS_COPY) as m:
    m[:8] = b"scribble"  # private: never reaches the file
    private = hashlib.sha256(m[8:]).hexdigest()
os.close(fd)
data = np.memmap(path, dtype="<f4", mode="r", offset=header)
print(shared, private, hashlib.sha256(data.tobytes()).hexdigest(), data.dtype, data.size)
"""


@pytest.mark.parametrize("memory", ["memfd", "tmpfs-huge"])
def test_consumers_map_held_memory(host: Host, memory: str):
    if memory == "tmpfs-huge":
        needs.capability("transparent huge pages for tmpfs", thp_available())
    else:
        host.env["ENSIO_TRANSFER_HUGE_PAGES"] = "off"  # read by the daemon ensio run starts
    out = host.work / "out"
    out.mkdir()
    cfg = write_config(host.work / "t.yaml", [str(out / "*.nc")])
    rng = np.random.default_rng(draw_seed(f"mmap-{memory}"))
    values = rng.random(3 * MIB // 4 + 1000, dtype=np.float32)
    blob = rng.bytes(HEADER) + values.astype("<f4").tobytes()
    p = host.ensio("run", "--transfer", str(cfg), "--component", "model", "--",
                   sys.executable, "-c", PRODUCER, str(out / "a.nc"), input=blob, text=False)
    assert p.returncode == 0, p.stderr
    for _ in range(2):  # the second consumer sees the original bytes too
        c = host.run(cfg, "post", sys.executable, "-c", CONSUMER, str(out / "a.nc"),
                     str(HEADER))
        assert c.returncode == 0, c.stderr
        shared, private, mapped, dtype, n = c.stdout.split()
        assert shared == hashlib.sha256(blob).hexdigest()
        assert private == hashlib.sha256(blob[8:]).hexdigest()
        assert mapped == hashlib.sha256(values.astype("<f4").tobytes()).hexdigest()
        assert (dtype, int(n)) == ("float32", values.size)
    assert not (out / "a.nc").exists()
    want = ("a private tmpfs with transparent huge pages" if memory == "tmpfs-huge"
            else "memfds with the kernel's default pages")
    assert want in host.log()
