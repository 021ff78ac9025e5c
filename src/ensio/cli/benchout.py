"""What every ``ensio bench …`` command does around its driver, spelt once.

A benchmark runs for minutes: a spinner on a terminal says which run is going
on, and nothing is drawn when standard error is a pipe (logs, CI). The results
go to a rich table on standard output, and optionally to JSON and a PNG.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["run_with_status", "write_results"]

T = TypeVar("T")


def run_with_status(name: str, work: Callable[[Callable[[str], None]], T]) -> T:
    """Call ``work(on_step)``; ``on_step(label)`` updates a spinner on a terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    status = console.status(name, spinner="dots") if console.is_terminal \
        else contextlib.nullcontext()
    with status as s:
        def on_step(label: str) -> None:
            if s is not None:
                s.update(f"{name}: {label}")

        return work(on_step)


def write_results(res: Mapping[str, Any], json_path: Path | None, plot_path: Path | None,
                  plot: Callable[[Mapping[str, Any], Path], None]) -> None:
    """Write ``res`` as JSON and draw ``plot`` where the user asked for them."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(res, indent=2) + "\n")
    if plot_path is not None:
        plot(res, plot_path)
