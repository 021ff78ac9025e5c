"""``ensio bench startup``: how long an ensio process takes before it does any work.

Why: every member job, pool worker, recovery and test starts ``ensio`` processes,
and each used to spend ~2 CPU-seconds importing numba, scipy.spatial, MPI and
netCDF before its first line of work (issue 24). This driver times, as child
processes of the same interpreter, the start-up of the commands started most
often, next to a bare ``python -c pass`` they are compared to:

``version_ms``
    ``ensio --version`` (``python -m ensio.cli.main --version``).
``analyse_import_ms``
    ``ensio analyse`` ready to read: the modules its ``run`` has imported when it
    opens the members (the command module, :mod:`ensio.offline`, the config loader
    and PyYAML; importing :mod:`mpi4py.MPI` initializes MPI). The analysis kernels
    load after the read.
``worker_import_ms``
    ``python -m ensio.cli.worker LIST`` up to its first look at the to-do list (a
    list that does not exist, so it stops there with exit status 2).
``run_transfer_ms``
    ``ensio run --transfer CONFIG --component C -- true``, daemon already running
    and interposer already built (both done by one untimed launch first).

Each probe is run once untimed (page cache, bytecode), then ``repeat`` times; the
median is reported, with the minimum and the median CPU time (user + system) of
the child, both less sensitive to other load than the median wall time. The result
holds ``python_ms``, each probe's ``*_above_python_ms`` and ``*_ratio`` (to bare
Python), the targets of issue 24 and whether each is met.

Nothing here imports numba or compiles: a benchmark of start-up must not time a
compilation (``make venv`` fills numba's cache once: ``python -m ensio.cli.warm``).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["KEYS", "PROBES", "TARGETS", "bench_startup", "env_note", "startup_table"]

#: What ``ensio analyse`` has imported when it reads the first member.
ANALYSE_READY = "import ensio.cli.main, ensio.cli.analyse, ensio.offline, ensio.config.load, yaml"

#: Probe name -> the JSON key of its median.
KEYS = {
    "python": "python_ms",
    "version": "version_ms",
    "analyse": "analyse_import_ms",
    "worker": "worker_import_ms",
    "run_transfer": "run_transfer_ms",
}

#: Issue 24's targets: (key, limit in ms, measured "absolute" or "above_python").
TARGETS = {
    "version": ("version_ms", 150.0, "absolute"),
    "analyse": ("analyse_import_ms", 500.0, "absolute"),
    "worker": ("worker_import_ms", 100.0, "above_python"),
    "run_transfer": ("run_transfer_ms", 100.0, "above_python"),
}

_TRANSFER_YAML = """\
components: [members, analysis]
connections:
  - name: forecasts
    from: members
    to: analysis
    files: ["forecast/*.nc"]
"""


def _probes(work: Path) -> dict[str, list[str]]:
    """The command line of each probe (``work``: a scratch directory)."""
    py = sys.executable
    return {
        "python": [py, "-c", "pass"],
        "version": [py, "-m", "ensio.cli.main", "--version"],
        "analyse": [py, "-c", ANALYSE_READY],
        "worker": [py, "-m", "ensio.cli.worker", str(work / "no-such-todo"), "--quiet"],
        "run_transfer": [py, "-m", "ensio.cli.main", "run", "--transfer",
                         str(work / "transfer.yaml"), "--component", "members",
                         "--socket-dir", str(work / "daemon"), "--", "true"],
    }


PROBES = tuple(KEYS)

#: Exit status each probe ends with when it worked (the worker stops at the missing list).
_EXPECTED_RC = {"worker": 2}


def _cpu_children() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time_once(argv: Sequence[str], env: Mapping[str, str], expect_rc: int
               ) -> tuple[float, float]:
    """Wall and CPU milliseconds of one run of ``argv``; raises if it ended unexpectedly.

    The CPU time barely changes with other load on the machine, the wall time does:
    both are kept so that a loaded machine's numbers can be read.
    """
    c0, t0 = _cpu_children(), time.perf_counter()
    proc = subprocess.run(argv, env=dict(env), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    ms, cpu = (time.perf_counter() - t0) * 1e3, (_cpu_children() - c0) * 1e3
    if proc.returncode != expect_rc:
        raise RuntimeError(f"{' '.join(argv)}: exit status {proc.returncode} "
                           f"(expected {expect_rc}): {proc.stderr.strip()[-500:]}")
    return ms, cpu


def bench_startup(repeat: int = 7, probes: Sequence[str] = PROBES,
                  on_step: Callable[[str], None] = lambda label: None) -> dict[str, Any]:
    """Time the ``probes`` (default: all), ``repeat`` runs each after one untimed run."""
    from .childenv import child_env
    from .machine import describe_machine

    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    unknown = set(probes) - set(PROBES)
    if unknown:
        raise ValueError(f"unknown probes {sorted(unknown)}; known: {list(PROBES)}")
    order = ["python"] + [p for p in PROBES if p in probes and p != "python"]
    env = child_env(drop_preload=True)
    res: dict[str, Any] = {"benchmark": "startup", "repeat": repeat,
                           "python": sys.executable, "runs_ms": {}, "min_ms": {}, "cpu_ms": {}}
    with tempfile.TemporaryDirectory(prefix="ensio-bench-startup-") as tmp:
        work = Path(tmp)
        (work / "transfer.yaml").write_text(_TRANSFER_YAML)
        argv = _probes(work)
        try:
            for name in order:
                on_step(name)
                rc = _EXPECTED_RC.get(name, 0)
                _time_once(argv[name], env, rc)  # untimed: page cache, daemon, interposer
                timed = [_time_once(argv[name], env, rc) for _ in range(repeat)]
                runs = [wall for wall, _ in timed]
                res["runs_ms"][name] = [round(r, 2) for r in runs]
                res["min_ms"][KEYS[name]] = round(min(runs), 2)
                res["cpu_ms"][KEYS[name]] = round(statistics.median(c for _, c in timed), 2)
                res[KEYS[name]] = round(statistics.median(runs), 2)
        finally:
            if "run_transfer" in order:
                _stop_daemon(work / "daemon")
    _derive(res)
    res["note"] = env_note()
    res["load_average"] = list(os.getloadavg())  # other load lengthens every probe
    res["machine"] = describe_machine()
    return res


def _stop_daemon(directory: Path) -> None:
    """Stop the staging daemon the run-transfer probe started (none: nothing to do)."""
    from ..transfer.runtime import stop_daemon

    if directory.exists():
        stop_daemon(directory)


def _derive(res: dict[str, Any]) -> None:
    """Add the differences and ratios to bare Python and the targets' verdicts."""
    base = res["python_ms"]
    res["targets"] = {}
    for name, key in KEYS.items():
        if name == "python" or key not in res:
            continue
        res[f"{key.removesuffix('_ms')}_above_python_ms"] = round(res[key] - base, 2)
        res[f"{key.removesuffix('_ms')}_ratio"] = round(res[key] / base, 2) if base > 0 else None
        _, limit, how = TARGETS[name]
        value = res[key] if how == "absolute" else res[key] - base
        res["targets"][key] = {"limit_ms": limit, "measured": how,
                               "value_ms": round(value, 2), "met": value <= limit}


def startup_table(res: Mapping[str, Any]) -> Any:
    """The rich table ``ensio bench startup`` prints."""
    from rich.table import Table

    t = Table(title=f"ensio start-up (median of {res['repeat']} runs; bare Python "
                    f"{res['python_ms']:.0f} ms, CPU {res['cpu_ms']['python_ms']:.0f} ms)")
    for col in ("command", "median ms", "min ms", "CPU ms", "above Python ms", "× Python",
                "target", "met"):
        t.add_column(col, justify="left" if col == "command" else "right")
    labels = {"version_ms": "ensio --version",
              "analyse_import_ms": "ensio analyse (ready to read)",
              "worker_import_ms": "ensio worker (ready)",
              "run_transfer_ms": "ensio run --transfer … -- true"}
    for key, label in labels.items():
        if key not in res:
            continue
        stem = key.removesuffix("_ms")
        target = res["targets"][key]
        where = "" if target["measured"] == "absolute" else " above Python"
        t.add_row(label, f"{res[key]:.0f}", f"{res['min_ms'][key]:.0f}",
                  f"{res['cpu_ms'][key]:.0f}", f"{res[f'{stem}_above_python_ms']:.0f}",
                  f"{res[f'{stem}_ratio']:.1f}",
                  f"≤ {target['limit_ms']:.0f}{where}", "yes" if target["met"] else "NO")
    return t


def env_note() -> str | None:
    """Why numbers may be high: bytecode not cached (every module compiled each run)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return ("PYTHONDONTWRITEBYTECODE is set: modules without a cached .pyc are compiled "
                "from source in every run")
    return None
