"""Time operations of the I/O server: pure accumulators over the samples of one period.

The graph (:mod:`.graph`) keeps one :class:`Accumulator` per (node, output period),
adds each sample of the period as it arrives and takes the result when the period
ends. Samples are float64 arrays of the field's shape with NaN for missing points (NaN
from the model, the field's ``missing_value`` and masked points were all turned into NaN
before). Missing samples are excluded point by point; a point with no valid sample in
the period is NaN in the result (``_FillValue`` in the file).

The state is what the operation needs and no more, because a server holds one
accumulator per field and open period (its memory is bounded by ``server_buffer_mb``):
``average`` keeps a float64 sum and an int32 count per point (12 bytes a point),
``accumulate`` a sum and a bool, ``minimum``/``maximum`` one float64 array,
``instant``/``once`` one sample.
"""

from __future__ import annotations

import abc

import numpy as np

__all__ = ["ACCUMULATORS", "CELL_METHODS", "Accumulate", "Accumulator", "Average", "Instant",
           "Maximum", "Minimum", "Once"]


class Accumulator(abc.ABC):
    """Reduces the samples of one period, point by point.

    Parameters
    ----------
    shape : tuple of int
        Shape of every sample, e.g. ``(nj, ni)`` or ``(nk, nj, ni)``.
    """

    def __init__(self, shape: tuple[int, ...]):
        self._shape = tuple(int(n) for n in shape)
        self._count = 0

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of every sample and of the result."""
        return self._shape

    @property
    def count(self) -> int:
        """Number of samples added (missing points included)."""
        return self._count

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of state held now (for the server's memory accounting)."""

    def add(self, values: np.ndarray) -> None:
        """Add one sample: an array of :attr:`shape`, NaN = missing (copied, not kept).

        Raises
        ------
        ValueError
            ``values`` does not have :attr:`shape`.
        """
        values = np.asarray(values, dtype=np.float64)
        if values.shape != self._shape:
            raise ValueError(f"{type(self).__name__.lower()}: sample of shape {values.shape}, "
                             f"expected {self._shape}")
        self._add(values)
        self._count += 1

    @abc.abstractmethod
    def _add(self, values: np.ndarray) -> None:
        """Fold a checked float64 sample into the state."""

    def result(self) -> np.ndarray:
        """The reduced field: float64 of :attr:`shape` (a new array), NaN where no valid sample."""
        if self._count == 0:
            return np.full(self._shape, np.nan)
        return self._result()

    @abc.abstractmethod
    def _result(self) -> np.ndarray:
        """The result once at least one sample was added."""


class _Sample(Accumulator):
    """Keeps one sample as is (missing points stay NaN)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape)
        self._kept: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._kept is None else self._kept.nbytes

    def _result(self) -> np.ndarray:
        return self._kept.copy()


class Instant(_Sample):
    """The last sample of the period (``cell_methods = "time: point"``)."""

    def _add(self, values: np.ndarray) -> None:
        if self._kept is None:
            self._kept = values.copy()
        else:
            np.copyto(self._kept, values)


class Once(_Sample):
    """The first sample ever (written once, without a time dimension)."""

    def _add(self, values: np.ndarray) -> None:
        if self._kept is None:
            self._kept = values.copy()


class Average(Accumulator):
    """Mean of the valid samples of each point: a float64 sum and an int32 count."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape)
        self._sum = np.zeros(self._shape)
        self._n = np.zeros(self._shape, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return self._sum.nbytes + self._n.nbytes

    def _add(self, values: np.ndarray) -> None:
        valid = ~np.isnan(values)
        np.add(self._sum, values, out=self._sum, where=valid)
        self._n += valid

    def _result(self) -> np.ndarray:
        out = np.full(self._shape, np.nan)
        np.divide(self._sum, self._n, out=out, where=self._n > 0)
        return out


class Accumulate(Accumulator):
    """Sum of the valid samples of each point (NaN where none was valid)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape)
        self._sum = np.zeros(self._shape)
        self._any = np.zeros(self._shape, dtype=bool)

    @property
    def nbytes(self) -> int:
        return self._sum.nbytes + self._any.nbytes

    def _add(self, values: np.ndarray) -> None:
        valid = ~np.isnan(values)
        np.add(self._sum, values, out=self._sum, where=valid)
        self._any |= valid

    def _result(self) -> np.ndarray:
        return np.where(self._any, self._sum, np.nan)


class _Extreme(Accumulator):
    """Running minimum or maximum: one float64 array, NaN until a valid sample."""

    _fold = staticmethod(np.fmin)    # fmin/fmax return the non-NaN operand when one is NaN

    def __init__(self, shape: tuple[int, ...]):
        super().__init__(shape)
        self._best = np.full(self._shape, np.nan)

    @property
    def nbytes(self) -> int:
        return self._best.nbytes

    def _add(self, values: np.ndarray) -> None:
        self._fold(self._best, values, out=self._best)

    def _result(self) -> np.ndarray:
        return self._best.copy()


class Minimum(_Extreme):
    """Smallest valid sample of each point."""

    _fold = staticmethod(np.fmin)


class Maximum(_Extreme):
    """Largest valid sample of each point."""

    _fold = staticmethod(np.fmax)


#: operation name (config ``operation``) -> accumulator class.
ACCUMULATORS: dict[str, type[Accumulator]] = {
    "instant": Instant, "average": Average, "minimum": Minimum, "maximum": Maximum,
    "accumulate": Accumulate, "once": Once,
}

#: operation name -> CF ``cell_methods`` method for the time axis (``time: <method>``).
CELL_METHODS: dict[str, str] = {
    "instant": "point", "average": "mean", "minimum": "minimum", "maximum": "maximum",
    "accumulate": "sum", "once": "point",
}
