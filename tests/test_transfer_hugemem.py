"""Held files in huge pages (issue 28 item 6): the private tmpfs of :mod:`ensio.transfer.hugemem`.

Checked: the daemon's memory is a tmpfs file in 2 MiB pages (a mapping of it is
PMD-mapped: ``ShmemPmdMapped`` in ``/proc/self/smaps``) where the machine allows it,
and memfds when switched off; no mount is left in the host's mount table and no
helper process stays; a consumer under ``ensio run`` reads by ``read`` and by
``mmap`` exactly the bytes a producer wrote, from that memory and not from disk.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import needs
import numpy as np
import pytest
from seeds import draw_seed
from transfer_support import host_fixture, interposer_cache_fixture, write_config  # noqa: F401

from ensio.transfer.hugemem import MemorySource, open_memory_source, thp_available

MIB = 1 << 20


def _pmd_mapped_kb(name: str) -> int:
    """``ShmemPmdMapped`` (kB) of this process's mappings of the file ``name`` (as
    ``/proc/self/fd`` names it)."""
    total, found = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            found = line.endswith(" " + name)
        elif found and line.startswith("ShmemPmdMapped:"):
            total += int(line.split()[1])
    return total


@pytest.fixture
def source(tmp_path: Path):
    needs.capability("transparent huge pages for tmpfs", thp_available())
    src = open_memory_source(tmp_path, logging.getLogger("test"), "auto")
    yield src
    src.close()


def test_files_get_huge_pages_and_no_mount_is_left(source: MemorySource, tmp_path: Path):
    assert source.kind == "tmpfs-huge", source.why
    data = np.random.default_rng(draw_seed("hugemem")).bytes(4 * MIB)
    fd = source.new("mem001.nc")
    try:
        assert os.write(fd, data) == len(data)
        name = os.readlink(f"/proc/self/fd/{fd}")
        assert name.endswith("(deleted)")
        ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # how consumers reopen it
        with mmap.mmap(ro, len(data), prot=mmap.PROT_READ) as m:
            assert hashlib.sha256(m).digest() == hashlib.sha256(data).digest()
            assert _pmd_mapped_kb(name) >= 2048
        os.close(ro)
    finally:
        os.close(fd)
    mounts = Path("/proc/self/mounts").read_text()
    assert str(tmp_path) not in mounts and "ensio-transfer" not in mounts
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "huge") not in out  # the mounting helper has exited


def test_off_gives_memfds(tmp_path: Path, caplog):
    with caplog.at_level(logging.INFO):
        src = open_memory_source(tmp_path, logging.getLogger("test"), "off")
    assert src.kind == "memfd" and src.dirfd is None
    fd = src.new("x.nc")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:x.nc")
    finally:
        os.close(fd)
    assert "memfds with the kernel's default pages (ENSIO_TRANSFER_HUGE_PAGES=off)" \
        in caplog.text


CONSUMER = r"""
import hashlib, mmap, os, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
    mapped = hashlib.sha256(m).hexdigest()
chunks = []
while (b := os.read(fd, 1 << 20)):
    chunks.append(b)
print(mapped, hashlib.sha256(b"".join(chunks)).hexdigest(),
      os.readlink(f"/proc/self/fd/{fd}"))
"""

PRODUCER = r"""
import os, sys
with open(sys.argv[1], "wb") as f:
    f.write(bytes.fromhex(sys.stdin.read().strip()))
"""


def test_consumer_reads_and_maps_huge_page_memory(host, tmp_path: Path):
    needs.capability("transparent huge pages for tmpfs", thp_available())
    out = host.work / "out"
    out.mkdir()
    cfg = write_config(tmp_path / "t.yaml", [str(out / "*.nc")])
    data = np.random.default_rng(draw_seed("hugemem-run")).bytes(3 * MIB + 12345)
    p = host.run(cfg, "model", sys.executable, "-c", PRODUCER, str(out / "a.nc"),
                 input=data.hex())
    assert p.returncode == 0, p.stderr
    c = host.run(cfg, "post", sys.executable, "-c", CONSUMER, str(out / "a.nc"))
    assert c.returncode == 0, c.stderr
    mapped, read, link = c.stdout.split(maxsplit=2)
    want = hashlib.sha256(data).hexdigest()
    assert mapped == want and read == want
    assert re.fullmatch(r"/#\d+ \(deleted\)", link.strip()), link  # the tmpfs, not a memfd
    assert not (out / "a.nc").exists()
    assert "a private tmpfs with transparent huge pages" in host.log()


def test_a_machine_that_refuses_gives_memfds_and_says_why(tmp_path: Path, monkeypatch, caplog):
    from ensio.transfer import hugemem

    def refuse(mountpoint: Path) -> int:
        raise RuntimeError("cannot mount a private tmpfs with huge pages: unshare: "
                           "unshare failed: Operation not permitted")

    monkeypatch.setattr(hugemem, "_mount_private_tmpfs", refuse)
    monkeypatch.setattr(hugemem, "thp_available", lambda: None)
    with caplog.at_level(logging.INFO):
        src = open_memory_source(tmp_path, logging.getLogger("test"), "auto")
    assert src.kind == "memfd" and "Operation not permitted" in src.why
    assert "memfds with the kernel's default pages (cannot mount" in caplog.text
    monkeypatch.setattr(hugemem, "thp_available", lambda: "shmem_enabled is 'deny'")
    assert open_memory_source(tmp_path, logging.getLogger("test")).why == \
        "shmem_enabled is 'deny'"


def test_the_environment_switches_it_off(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ENSIO_TRANSFER_HUGE_PAGES", "off")
    src = open_memory_source(tmp_path, logging.getLogger("test"))
    assert src.kind == "memfd" and src.why == "ENSIO_TRANSFER_HUGE_PAGES=off"
