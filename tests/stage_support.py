"""Cases for the staging and backup tests: tiled "member files" of random bytes.

Staging and the backup copy whole files and never open them as netCDF (a
declared ``ensemble.tiles`` needs no file to count the tiles), so random
bytes of different sizes make the cases small and fast; each file's expected
holder rank and local path are computed here from the rule the docs state,
not by the code under test.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ensio.config.load import config_from_dict
from ensio.config.schema import Config

LOCAL = "local/{host}/r{rank:02d}"
BACKUP = "backup/c{cycle:03d}"


@dataclass
class StageCase:
    root: Path
    config: Config
    n_e: int
    n_tiles: int
    #: (member, tile) -> global path
    files: dict[tuple[int, int], Path]

    def expected_local(self, member: int, tile: int, n_ranks: int, host: str) -> Path:
        """Rank f mod R holds file f = (member-1)*P + tile; its dir / the file's name."""
        f = (member - 1) * self.n_tiles + tile
        r = f % n_ranks
        return self.root / "local" / host / f"r{r:02d}" / self.files[member, tile].name

    def local_dirs(self, n_ranks: int, hosts: list[str]) -> list[Path]:
        return [self.root / "local" / hosts[r] / f"r{r:02d}" for r in range(n_ranks)]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_case(root: Path, rng: np.random.Generator, *, n_e: int = 3, n_tiles: int = 2,
              local: str | None = LOCAL, backup: str | None = BACKUP,
              extra_io: dict | None = None, write: bool = True) -> StageCase:
    """``n_e`` members of ``n_tiles`` tiles each, random bytes of random sizes.

    ``write=False`` only names them (the other MPI ranks, while rank 0 writes).
    """
    (root / "glob").mkdir(parents=True, exist_ok=True)
    files = {}
    for m in range(1, n_e + 1):
        for t in range(n_tiles):
            p = root / "glob" / f"mem{m:03d}_{t:04d}.nc"
            if write:
                p.write_bytes(rng.integers(0, 256, int(rng.integers(1000, 50_000)),
                                           np.uint8).tobytes())
            files[m, t] = p
    io = {k: v for k, v in (("local_dir", local), ("backup_dir", backup)) if v is not None}
    raw = {
        "ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": n_e,
                     "variables": ["x"], "tiles": {"count": n_tiles, "layout": [n_tiles, 1]}},
        "io": io | (extra_io or {}),
    }
    return StageCase(root, config_from_dict(raw, base_dir=root), n_e, n_tiles, files)


def make_dirs(dirs: list[Path]) -> None:
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative name -> sha256): what "nothing modified" compares."""
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".ensio-tmp." in p.name]


def ensio(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the ``ensio`` command in a child process (no fault variables unless given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENSIO_FAULT_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ensio.cli.main", *args], env=env,
                          capture_output=True, text=True, check=False)
