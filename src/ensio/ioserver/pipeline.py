"""What a server (or the sync root, or an attached-mode writer) feeds: Graph + FileSet.

The server core only moves bytes and assembles global arrays; everything that
decides what is written goes through :class:`OutputPipeline`, which the core
receives as a factory so its tests can inject a recording sink instead.
The graph (:mod:`.graph`) and the writer (:mod:`.writer`) are imported when a
pipeline is built, not when this module is imported, so the transport can be
loaded (and tested) on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .config import IOServerConfig
from .geometry import DomainGeometry

__all__ = ["OutputPipeline", "Sink", "SinkFactory", "field_periods", "with_missing",
           "domain_geometry", "field_mask"]


class Sink(Protocol):
    """The interface the server core talks to (an :class:`OutputPipeline` or a test double)."""

    @property
    def nbytes(self) -> int: ...  # bytes it holds (pushed data, accumulators)
    def push(self, field_id: str, step: int, data: np.ndarray) -> None: ...
    def advance(self, step: int) -> None: ...
    def finish(self, last_step: int) -> None: ...
    def close(self) -> Any: ...


class SinkFactory(Protocol):
    def __call__(self, cfg: IOServerConfig, files: Sequence[str],
                 geometry: Mapping[str, DomainGeometry], out_dir: Path, history: str) -> Sink: ...


def with_missing(data: np.ndarray, mask: np.ndarray | None,
                 missing_value: float | None) -> np.ndarray:
    """A float64 copy of ``data`` with NaN at masked points and at ``missing_value``.

    Shapes: ``data`` ``(..., *hor)``; ``mask`` ``hor`` (True = valid), broadcast
    over the leading (level) dimension.
    """
    out = np.array(data, dtype=np.float64)
    if missing_value is not None:
        # compared in the sender's precision: float32 1e20 is not float64 1e20
        out[data == np.asarray(missing_value, dtype=data.dtype)] = np.nan
    if mask is not None:
        out[..., ~mask] = np.nan
    return out


def field_mask(cfg: IOServerConfig, geometry: Mapping[str, DomainGeometry],
               field_id: str) -> np.ndarray | None:
    """The domain mask of a field's grid (None when every point is valid)."""
    g = geometry.get(cfg.grids[cfg.fields[field_id].grid].domain)
    return None if g is None else g.mask


def domain_geometry(cfg: IOServerConfig, domain_id: str,
                    arrays: Mapping[str, np.ndarray | None]) -> DomainGeometry:
    """The writer's geometry object from assembled global arrays (see :mod:`.parts`)."""
    return DomainGeometry(domain=cfg.domains[domain_id], **arrays)


def field_periods(cfg: IOServerConfig, files: Sequence[str] | None = None
                  ) -> dict[str, tuple[int, ...]]:
    """Per source field, the step periods at which ``files`` need it (Graph's rule)."""
    from .graph import Graph  # the graph is built here, on demand (module docstring)

    graph = Graph(cfg, files=files)
    return {f: tuple(graph.period_steps(f)) for f in cfg.sources}


class OutputPipeline:
    """The post-processing graph of ``files`` composed with their CF writer.

    Parameters
    ----------
    cfg : IOServerConfig
    files : sequence of str
        Ids of the files this process writes.
    geometry : mapping
        Global :class:`DomainGeometry` per domain id.
    out_dir : Path
    history : str
        The files' ``history`` attribute.
    """

    def __init__(self, cfg: IOServerConfig, files: Sequence[str],
                 geometry: Mapping[str, DomainGeometry], out_dir: Path, history: str) -> None:
        from .graph import Graph
        from .writer import FileSet

        self._cfg = cfg
        self._geometry = geometry
        self._graph = Graph(cfg, files=files)
        self._files = FileSet(cfg, files, geometry, out_dir, history)

    @property
    def nbytes(self) -> int:
        """Bytes the graph holds (pushed data not yet advanced, open accumulators)."""
        return self._graph.nbytes

    def push(self, field_id: str, step: int, data: np.ndarray) -> None:
        """A source field's complete global data at ``step`` (missing values applied here)."""
        if not self._graph.needs(field_id, step):
            return  # sent for another server's files at this step
        fd = self._cfg.fields[field_id]
        mask = field_mask(self._cfg, self._geometry, field_id)
        self._graph.push(field_id, step, with_missing(data, mask, fd.missing_value))

    def advance(self, step: int) -> None:
        """Every source of every step <= ``step`` was pushed: write the periods that ended."""
        records = self._graph.advance(step)
        if records:
            self._files.write(records)

    def finish(self, last_step: int) -> None:
        records = self._graph.finish(last_step)
        if records:
            self._files.write(records)

    def close(self) -> Any:
        """Close every file (valid, with every record written so far); the writer's stats."""
        return self._files.close()
