"""Transfer across two hosts (network namespaces, see transfer_hosts.py): every pattern.

Unmodified producers (ncgen, nccopy) on one host, unmodified consumers (ncdump, a
netCDF4 Python program) on the other: the bytes read equal, byte for byte, the file a
run without transfer writes, and the transferred paths never appear on disk. The
pattern decides which host's daemon receives which file; a host that should not get
a file does not hold it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transfer_hosts import NetHost, hosts_config, two_hosts_fixture  # noqa: F401
from transfer_support import CDL, interposer_cache_fixture  # noqa: F401

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("ncgen", "ncdump", "nccopy")),
    reason="needs ncgen, ncdump, nccopy (netcdf-bin)")

PY = sys.executable

READER = r"""
import hashlib, json, sys
import netCDF4
path = sys.argv[1]
with open(path, "rb") as f:
    data = f.read()
with netCDF4.Dataset(path) as ds:
    ds.set_auto_mask(False)
    values = {k: v[...].tolist() for k, v in ds.variables.items()}
print(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "netcdf4": values}))
"""

#: file name → the producing command (a plain run of it writes the reference)
PRODUCERS = {
    "mem000.nc": ["ncgen", "-4", "-o", "{out}", "sample.cdl"],
    "mem001.nc": ["nccopy", "-k", "classic", "in/nc4.nc", "{out}"],
}

#: pattern → (host → components there, [(host, rank, file)] produced, host → files it holds)
CASES = {
    # producer process i → consumer process i's host: post 0 is on b, post 1 on a
    "1-1": ({"b": ["post"], "a": ["model", "post"]},
            [("a", 0, "mem000.nc"), ("a", 1, "mem001.nc")],
            {"b": ["mem000.nc"], "a": ["mem000.nc", "mem001.nc"]}),
    # every file to every consumer host
    "1-N": ({"a": ["model", "post"], "b": ["post"]},
            [("a", 0, "mem000.nc"), ("a", 1, "mem001.nc")],
            {"b": ["mem000.nc", "mem001.nc"], "a": ["mem000.nc", "mem001.nc"]}),
    # all files to one host: producers on a and b, the consumer on b
    "N-1": ({"a": ["model"], "b": ["model", "post"]},
            [("a", 0, "mem000.nc"), ("b", 1, "mem001.nc")],
            {"b": ["mem000.nc", "mem001.nc"], "a": ["mem000.nc"]}),
    # producers and consumers on both: each consumer host receives every file
    "all-to-all": ({"a": ["model", "post"], "b": ["model", "post"]},
                   [("a", 0, "mem000.nc"), ("b", 1, "mem001.nc")],
                   {"a": ["mem000.nc", "mem001.nc"], "b": ["mem000.nc", "mem001.nc"]}),
}


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture
def work(two_hosts):
    """Inputs and the reference files (plain runs, no transfer) in the shared directory."""
    a, _ = two_hosts
    w = a.work
    (w / "sample.cdl").write_text(CDL)
    (w / "in").mkdir()
    (w / "ref").mkdir()
    (w / "fc").mkdir()
    subprocess.run(["ncgen", "-4", "-o", "in/nc4.nc", "sample.cdl"], cwd=w, check=True)
    for name, argv in PRODUCERS.items():
        subprocess.run([x.format(out=f"ref/{name}") for x in argv], cwd=w, check=True)
    return w


def _held(host: NetHost) -> dict[str, object]:
    return {Path(s.path).name: s for s in host.status() or []}


@pytest.mark.parametrize("pattern", sorted(CASES))
def test_every_pattern_crosses_the_hosts(two_hosts, work, pattern):
    hosts = dict(zip("ab", two_hosts, strict=True))
    placement, produced, expected = CASES[pattern]
    config = hosts_config(work / "t.yaml", placement, pattern, ["fc/mem*.nc"])
    for h in hosts.values():  # each host's daemon listens before any producer starts
        h.up(config, "post" if "post" in placement[h.name] else "model")
    for host, rank, name in produced:
        argv = [x.format(out=f"fc/{name}") for x in PRODUCERS[name]]
        _ok(hosts[host].run(config, "model", *argv, rank=rank))
    for host, names in expected.items():
        held = _held(hosts[host])
        assert sorted(held) == names, (host, held)
        assert all(s.state == "complete" for s in held.values())
        if "post" not in placement[host]:
            continue
        for name in names:
            ref = work / "ref" / name
            got = json.loads(_ok(hosts[host].run(config, "post", PY, "-c", READER,
                                                 f"fc/{name}")).stdout)
            want = json.loads(_ok(subprocess.run([PY, "-c", READER, str(ref)],
                                                 capture_output=True, text=True)).stdout)
            assert got["sha256"] == hashlib.sha256(ref.read_bytes()).hexdigest()
            assert got == want
            dumped = _ok(hosts[host].run(config, "post", "ncdump", f"fc/{name}")).stdout
            plain = _ok(subprocess.run(["ncdump", f"ref/{name}"], cwd=work,
                                       capture_output=True, text=True)).stdout
            assert dumped == plain
    assert not list((work / "fc").iterdir())  # never on disk, on either host
