"""Progress bars of long phases (read, analysis, write, products), for people at a terminal.

A :class:`PhaseProgress` shows one bar per phase on standard error, only when
standard error is a terminal and only on rank 0; everywhere else (piped,
redirected to a log, batch jobs, ranks > 0) it does nothing and writes not a
byte, so logs hold no control characters. Bars are transient: a finished
phase's bar is erased (the timing line of ``ensio analyse`` reports the
phases' seconds).

The library takes an *advance* callback, ``advance(n=1)``, per unit of work
(a member read or written, a product written), so the I/O loops know nothing
of terminals::

    with PhaseProgress.for_rank(comm.rank) as progress:
        with progress.phase("read", total=n_members, unit="members") as advance:
            ens.read(progress=advance)
        with progress.phase("analysis") as _:   # no total: a pulsing bar and the time
            ...

Under ``mpiexec`` the launcher usually forwards the ranks' output through
pipes, so no bar appears there unless rank 0's standard error is the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["Advance", "PhaseProgress", "no_progress"]

#: Called with the number of units just completed (default 1).
Advance = Callable[..., None]


def no_progress(n: int = 1) -> None:
    """The advance callback that does nothing."""


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class PhaseProgress:
    """Progress bars of named phases (a context manager).

    Parameters
    ----------
    enabled : bool
        Show bars; ``False`` makes every method a no-op (nothing imported,
        nothing written).
    stream : text stream, optional
        Where the bars go (default standard error).
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._progress: Any = None

    @classmethod
    def for_rank(cls, rank: int, stream: TextIO | None = None) -> PhaseProgress:
        """Enabled on rank 0 when ``stream`` (default standard error) is a terminal."""
        stream = stream if stream is not None else sys.stderr
        return cls(rank == 0 and _is_terminal(stream), stream)

    def __enter__(self) -> PhaseProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(file=self.stream, force_terminal=True)
            self._progress = Progress(
                TextColumn("{task.description:<10}"), BarColumn(),
                TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                console=console, transient=True, redirect_stdout=False, redirect_stderr=False,
            )  # fmt: skip
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    @contextmanager
    def phase(self, description: str, total: int | None = None,
              unit: str = "") -> Iterator[Advance]:
        """A bar for one phase; yields its advance callback.

        Parameters
        ----------
        description : str
            Shown left of the bar (``"read"``, ``"write"`` ...).
        total : int, optional
            Units of work; ``None`` shows a pulsing bar and the elapsed time.
        unit : str
            What a unit is (``"members"``), shown after the count.
        """
        if self._progress is None:
            yield no_progress
            return
        progress = self._progress
        count = "" if total is None else f"0/{total} {unit}".rstrip()
        task = progress.add_task(description, total=total, count=count)
        done = 0

        def advance(n: int = 1) -> None:
            nonlocal done
            done += n
            count = "" if total is None else f"{done}/{total} {unit}".rstrip()
            progress.update(task, advance=n, count=count)

        try:
            yield advance
        finally:
            progress.remove_task(task)

