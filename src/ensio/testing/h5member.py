"""The contract's member file as plain HDF5, written by h5py (as Veros writes its restarts).

Why apart from :mod:`ensio.testing.store_contract`: the same variables as
:func:`~ensio.testing.store_contract.make_member` (so every generic test runs
unchanged), made without the netCDF library; only the plain-HDF5 kinds of
:data:`~ensio.testing.store_contract.CASES` need it.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from .shape import DIMS, NRECS

__all__ = ["make_hdf5_member"]


def _h5_storage(kind: str, shape: tuple[int, ...]) -> dict[str, object]:
    """h5py's keywords for a storage kind (h5py's default layout is contiguous)."""
    if kind == "zlib":  # several chunks, with partial edge chunks
        chunks = tuple(max(1, n // 2) for n in shape)
        return {"chunks": chunks, "compression": "gzip", "compression_opts": 4, "shuffle": True}
    return {}


def make_hdf5_member(path: Path, kind: str, rng: np.random.Generator) -> Path:
    """:func:`make_member`'s variables in a plain HDF5 file written by h5py (as Veros writes).

    No ``_NCProperties``, no dimension scales: netCDF-C shows ``phony_dim_N``
    dimensions; ``rec`` is extensible along its first axis (an unlimited phony
    dimension), hence chunked.
    """
    dims = {n: (NRECS if n == "time" else v) for n, v in DIMS.items()}
    specs: list[tuple[str, str, tuple[str, ...]]] = [
        ("t3", "<f8", ("lev", "lat", "lon")), ("s2", "<f4", ("lat", "lon")),
        ("big3", ">f8", ("lev", "lat", "lon")), ("big2", ">f4", ("lat", "lon")),
        ("mask", "<i2", ("lat", "lon")), ("nv", "<f8", ("lat",)),
    ]  # fmt: skip
    with h5py.File(path, "w") as f:
        f.attrs["title"] = np.bytes_("ensio store test")
        f.attrs["history"] = np.arange(3, dtype="i4")
        lat = f.create_dataset("lat", data=np.linspace(-60, 60, DIMS["lat"]),
                               **_h5_storage(kind, (DIMS["lat"],)))  # fmt: skip
        lat.attrs["units"] = np.bytes_("degrees_north")
        for name, typ, names in specs:
            shape = tuple(dims[d] for d in names)
            if np.dtype(typ).kind == "f":
                data = rng.standard_normal(shape).astype(typ)
            else:
                data = rng.integers(0, 1000, shape).astype(typ)
            extra = {"fillvalue": np.float32(-999.0)} if name == "s2" else {}
            var = f.create_dataset(name, data=data, **_h5_storage(kind, shape), **extra)
            var.attrs["long_name"] = np.bytes_(f"variable {name}")
            if name == "s2":
                var.attrs["_FillValue"] = np.float32(-999.0)
        label = rng.choice(np.array(list(b"abcxyz"), dtype="u1"), (5, 2)).view("S1")
        f.create_dataset("label", data=label, **_h5_storage(kind, (5, 2)))
        rec = f.create_dataset("rec", data=rng.standard_normal((NRECS, DIMS["lat"], DIMS["lon"])),
                               maxshape=(None, DIMS["lat"], DIMS["lon"]),
                               chunks=(1, DIMS["lat"], DIMS["lon"]))  # fmt: skip
        rec.attrs["units"] = np.bytes_("K")
        grp = f.create_group("ocean")
        grp.create_dataset("sst", data=rng.standard_normal((5, 7)).astype("f4"),
                           **_h5_storage(kind, (5, 7)))  # fmt: skip
    return path
