"""The C/Fortran client's attached and sync modes: the Python client driven from C.

Why embedding: attached and sync run the post-processing graph and the CF
writer on the model ranks themselves, and those are Python. Rewriting them in C
would give a second implementation whose files could differ; instead the C
library (``csrc/ensio_ioclient_py.c``, built into ``libensio_ioclient_py.so``
and loaded only when a run has no server ranks, or for ``read_restart``) starts
the interpreter of the ensio installation inside the model process and calls
:class:`Session`, which holds one :class:`~.client.Client` built by
:func:`~.start.start` on the model's communicator. So the C and Fortran calls
have exactly the Python API's semantics and write the same files.

The C side passes arrays as addresses (``int``) with the element count it
knows; this module wraps them as numpy views (no copy until the client's own
copy) with the shapes the C header documents. Errors are raised as
:class:`~.protocol.IOServerError` (the C shim turns them into the one-line
``ensio_ioclient_errmsg``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from .protocol import IOServerError

__all__ = ["Session", "config_mode", "read_block", "as_array"]

#: dtype codes shared with the C shim (ensio_ioclient.h: ENSIO_IOCLIENT_F64 ...).
DTYPES = {0: np.dtype(np.float64), 1: np.dtype(np.float32), 2: np.dtype(np.int32)}


def as_array(addr: int, count: int, dtype: np.dtype) -> np.ndarray:
    """A writable 1-D numpy view of ``count`` elements at C address ``addr``."""
    if count == 0:
        return np.empty(0, dtype)
    if not addr:
        raise IOServerError("a NULL array was passed for a non-empty block")
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(addr)
    return np.frombuffer(buf, dtype=dtype, count=count)


#: ``ioserver.mode`` -> the code ``ensio_ioclient_init_config`` dispatches on.
MODES = {"server": 0, "attached": 1, "sync": 2}


def config_mode(config: str) -> int:
    """The config's ``ioserver.mode`` (resolved and checked like Python's ``start``)."""
    from .configload import load_ioserver_config

    return MODES[load_ioserver_config(config).mode]


def _index(ndim: int, addr: int) -> tuple[int, ...]:
    """``ndim`` int64 values at C address ``addr`` (a start or a shape)."""
    return tuple(int(x) for x in as_array(addr, ndim, np.dtype(np.int64)))


def read_block(path: str, variable: str, ndim: int, start: int, shape: int, addr: int,
               dtype_code: int) -> None:
    """``ensio_ioclient_read_restart_*``: this rank's box of ``variable`` into C memory."""
    from .restart import read_restart_blocks

    box = _index(ndim, shape)
    block = read_restart_blocks(path, {variable: (_index(ndim, start), box)})[variable]
    out = as_array(addr, int(np.prod(box, dtype=np.int64)), DTYPES[dtype_code])
    out[...] = block.reshape(-1)  # to the C type, as netCDF-C's nc_get_vara_<type>


class Session:
    """One C client in attached or sync mode (created by the C library's init).

    Parameters
    ----------
    comm_f : int
        The Fortran handle (``MPI_Comm_c2f``) of the communicator the C model
        passed to init (every process of the job: there are no server ranks).
    config : str
        The YAML file with the ``ioserver:`` section; its ``mode`` decides.
    context : str
        The files' history label (as :func:`~.start.start`).
    """

    def __init__(self, comm_f: int, config: str, context: str) -> None:
        from mpi4py import MPI

        from .configload import load_ioserver_config
        from .start import start

        cfg = load_ioserver_config(config)
        if cfg.mode == "server":
            raise IOServerError(
                f"{config}: ioserver.mode is server but the job has no ioserver ranks; start "
                "the model MPMD (mpiexec -n P MODEL : -n S ensio ioserver CONFIG) or set "
                "mode: attached or sync")
        self.client = start(MPI.Comm.f2py(comm_f), cfg, context)
        self._dtypes = DTYPES
        self._restart: dict[str, tuple[tuple[int, ...], np.ndarray]] = {}

    def model_comm(self) -> int:
        """The Fortran handle of the model communicator (freed by :meth:`finalize`)."""
        return int(self.client.comm.py2f())

    def set_domain(self, domain_id: str, ibegin: int, ni: int, jbegin: int, nj: int,
                   lon: int, lat: int, lon_bounds: int, lat_bounds: int, mask: int,
                   area: int) -> None:
        """Addresses (0 = not given) with the C header's sizes for the domain's type."""
        d = self.client.cfg.domains.get(domain_id)
        if d is None:  # the client's own message (names the known domains)
            self.client.set_domain(domain_id, ibegin=ibegin, ni=ni, jbegin=jbegin, nj=nj)
            return
        if ni < 0 or nj < 0:
            raise IOServerError(f"model rank {self.client.rank}: domain {domain_id!r}: "
                                f"negative ni {ni} or nj {nj}")
        npts = ni * nj
        nlon, nlat = (ni, nj) if d.type == "rectilinear" else (npts, npts)
        nvx = {"rectilinear": 2, "curvilinear": 4}.get(d.type, d.nvertex or 0)
        if lon_bounds and nvx < 1:
            raise IOServerError(f"model rank {self.client.rank}: domain {domain_id!r}: bounds "
                                "given but the domain has no nvertex")
        f64, i32 = DTYPES[0], DTYPES[2]
        arrays = {
            "lon": (lon, nlon, f64), "lat": (lat, nlat, f64),
            "lon_bounds": (lon_bounds, nlon * nvx, f64),
            "lat_bounds": (lat_bounds, nlat * nvx, f64),
            "mask": (mask, npts, i32), "area": (area, npts, f64)}
        given = {k: (as_array(a, n, t).copy() if a else None) for k, (a, n, t) in arrays.items()}
        if given["mask"] is not None:
            given["mask"] = given["mask"] != 0
        self.client.set_domain(domain_id, ibegin=ibegin, ni=ni, jbegin=jbegin, nj=nj, **given)

    def close_definition(self) -> None:
        self.client.close_definition()

    def update_timestep(self, step: int) -> None:
        self.client.update_timestep(step)

    def send(self, field_id: str, addr: int, count: int, dtype_code: int) -> None:
        """A flat C-order part; the client checks its size against the part's shape."""
        if count < 0:
            raise IOServerError(f"model rank {self.client.rank}: field {field_id!r}: "
                                f"negative count {count}")
        self.client.send(field_id, as_array(addr, count, self._dtypes[dtype_code]))

    def is_active(self, field_id: str, step: int) -> int:
        return int(self.client.is_active(field_id, step if step >= 1 else None))

    def restart_put(self, name: str, ndim: int, start: int, shape: int, dtype_code: int,
                    addr: int) -> None:
        """One block of the restart being collected (copied now)."""
        box = _index(ndim, shape)
        data = as_array(addr, int(np.prod(box, dtype=np.int64)), DTYPES[dtype_code])
        self._restart[name] = (_index(ndim, start), data.reshape(box).copy())

    def write_restart(self, path: str, template: str, rid: int) -> None:
        """``ensio_ioclient_write_restart``: the collected blocks to ``Client.write_restart``."""
        variables, self._restart = self._restart, {}
        self.client.write_restart(Path(path), variables, template=Path(template), rid=rid)

    def finalize(self) -> tuple[float, ...]:
        """Close (collective), free the model communicator; the C report's numbers."""
        rep = self.client.close()
        self.client.comm.Free()
        return (rep.blocked_seconds, float(rep.bytes_sent), rep.server_busy_fraction,
                float(rep.server_memory_hwm_bytes), float(rep.bytes_written),
                float(rep.files_written))

    def abort(self, reason: str) -> None:
        """Ends the job (``MPI_Abort`` after closing the files this rank writes)."""
        self.client.abort(reason)
