"""A small ``io.mode: shuffle`` case for the commit tests (issue 13: lock, record, 2PC).

The members come from ``ensio synth``; they are cut into tiles (the global
copies) and tile file f = m·P + t is placed in the local directory of rank f
(``local/r{rank}``), as ``ensio stage in`` does. The reference analysis is a
``files``-mode run on the untiled members, never the code under test.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from tiles_support import PATTERN, tile_case

from ensio.cli.synth import main as synth_main
from ensio.layout.tiles import TileBox, declared_geometry

NX, NY = 11, 9
LAYOUTS = {1: (1, 1), 2: (2, 1), 4: (2, 2)}
#: N_mpi -> (N_e, P): at least two local directories
SHAPES = {2: (2, 1), 4: (2, 2)}
MARKERS = (".ensio-journal", ".ensio-lock", "ensio-tmp", "ensio-staged")


@dataclass
class ShuffleCase:
    root: Path
    n_e: int
    p: int
    boxes: list[TileBox]

    @property
    def config(self) -> Path:
        return self.root / "shuffle.yaml"

    @property
    def global_dir(self) -> Path:
        return self.root / "tiles"

    @property
    def locals(self) -> list[Path]:
        """The local directories holding a tile (one per file)."""
        return [self.root / "local" / f"r{f}" for f in range(self.n_e * self.p)]

    def tile(self, f: int) -> Path:
        """The local copy of file f = m·P + t."""
        name = PATTERN.format(member=f // self.p + 1, tile=f % self.p).split("/")[-1]
        return self.root / "local" / f"r{f}" / name

    def tiles(self) -> list[Path]:
        return [self.tile(f) for f in range(self.n_e * self.p)]

    def digests(self) -> list[str]:
        return [hashlib.sha256(t.read_bytes()).hexdigest() for t in self.tiles()]

    def leftovers(self) -> list[str]:
        """Journals, locks, temporaries anywhere in the case."""
        return sorted(str(p) for p in self.root.rglob("*") if any(m in p.name for m in MARKERS))


def make_shuffle_case(root: Path, n_ranks: int, *, fsync: bool = False) -> ShuffleCase:
    """Members, their tiles (global), the local copies and ``shuffle.yaml`` (serial)."""
    n_e, p = SHAPES[n_ranks]
    px, py = LAYOUTS[p]
    geo = declared_geometry((NY, NX), p, (px, py), 1)
    argv = [str(root), "--nx", str(NX), "--ny", str(NY), "--members", str(n_e),
            "--seed", "5", "--format", "cdf5"]  # fmt: skip
    assert synth_main(argv) == 0
    tile_case(root, geo, n_e)
    case = ShuffleCase(root, n_e, p, list(geo.boxes))
    for r in range(n_ranks):
        (root / "local" / f"r{r}").mkdir(parents=True, exist_ok=True)
    for f in range(n_e * p):
        shutil.copy(root / PATTERN.format(member=f // p + 1, tile=f % p), case.tile(f))
    raw = yaml.safe_load((root / "ensio.yaml").read_text())
    raw["output"] = {"mean": None, "spread": None}
    raw["io"]["fsync"] = fsync
    (root / "files.yaml").write_text(yaml.safe_dump(raw))
    raw["ensemble"]["members"] = PATTERN
    raw["ensemble"]["tiles"] = {"count": p, "layout": [px, py], "halo": 1}
    raw["io"].update({"mode": "shuffle", "local_dir": "local/r{rank}"})
    case.config.write_text(yaml.safe_dump(raw))
    return case
