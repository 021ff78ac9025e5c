"""Helpers of the job-pool tests (to-do list, worker, local back-end).

Child processes here start through :data:`LIGHT`, which registers the
``ensio`` package without running ``ensio/__init__.py`` (that imports the
analysis, ~1 s of CPU per process on the test machine). Workers, lists and
locks import only the standard library, PyYAML and their own modules, so the
many short-lived processes of these tests stay cheap; one test runs the real
``python -m ensio.cli.worker`` entry for fidelity.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import needs

from ensio.workflow.backends.base import JobSpec
from ensio.workflow.spec import WorkerSpec

PY = sys.executable

#: Python source registering ``ensio`` as a bare namespace (no package __init__).
LIGHT = (
    "import importlib.util as _u, sys as _s, types as _t\n"
    "_spec = _u.find_spec('ensio')\n"
    "_m = _t.ModuleType('ensio'); _m.__path__ = list(_spec.submodule_search_locations)\n"
    "_m.__spec__ = _spec; _s.modules['ensio'] = _m\n"
)

#: A worker process: ``WORKER + [list, --time-limit, …]``.
WORKER = [PY, "-c", LIGHT + "from ensio.cli.worker import main\n"
          "raise SystemExit(main(_s.argv[1:]))\n"]

#: Member command body (run with ``python -S -c``): optional wait, then the
#: side effect (one O_APPEND line) and the output. Argument 1: control dir,
#: 2: the forecast path ({forecast}). Files in the control dir steer it:
#: ``block-<task>`` → write our pid to the FIFO ``fifo`` and wait for a line
#: on ``go`` (if it exists) or forever; ``sleep-<task>`` → sleep that long;
#: ``fail-<task>`` → exit 1; ``noout-<task>`` → exit 0 without output; ``io-<task>``
#: → report 0.25 s of I/O through ``ENSIO_REPORT``.
MEMBER = r"""
import os, sys, time
ctl, out = sys.argv[1], sys.argv[2]
task, token = os.environ["ENSIO_TASK"], os.environ["ENSIO_TOKEN"]
def has(name):
    return os.path.exists(os.path.join(ctl, f"{name}-{task}"))
if has("block"):
    with open(os.path.join(ctl, "fifo"), "w") as f:
        f.write(f"{os.getpid()}\n")
    if os.path.exists(os.path.join(ctl, "go")):
        open(os.path.join(ctl, "go")).readline()
    else:
        time.sleep(3600)
if has("sleep"):
    time.sleep(float(open(os.path.join(ctl, f"sleep-{task}")).read()))
if has("fail"):
    sys.exit(1)
fd = os.open(os.path.join(ctl, "side.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"{task} {token} {time.time_ns()}\n".encode())
os.close(fd)
if has("io"):
    with open(os.environ["ENSIO_REPORT"], "w") as f:
        f.write('{"io_seconds": 0.25}')
if not has("noout"):
    with open(out, "w") as f:
        f.write(token)
"""

#: The analysis: one side-effect line, and the argv it got into ``analysis-argv.json``.
ANALYSIS = r"""
import json, os, sys, time
ctl = sys.argv[1]
fd = os.open(os.path.join(ctl, "side.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"analysis {os.environ['ENSIO_TOKEN']} {time.time_ns()}\n".encode())
os.close(fd)
with open(os.path.join(ctl, "analysis-argv.json"), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def quote(arg: str) -> str:
    """Quote for a command template: one shlex word, braces escaped for str.format."""
    arg = arg.replace("{", "{{").replace("}", "}}")
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def make_spec(ctl: Path, *, analysis: bool = True, task_estimate: float = 0.05,
              **kw: Any) -> WorkerSpec:
    """A worker spec whose members run :data:`MEMBER` and whose analysis runs :data:`ANALYSIS`."""
    return WorkerSpec(
        member_command=f"{PY} -S -c {quote(MEMBER)} {ctl} {{forecast}}",
        forecast=str(ctl / "forecast" / "mem{member:03d}.nc"),
        workdir=str(ctl / "work" / "mem{member:03d}"),
        analysis_command=(f"{PY} -S -c {quote(ANALYSIS)} {ctl} {{analysis_ranks}} {{members}}"
                          if analysis else None),
        records=str(ctl / "records.jsonl"),
        task_estimate=task_estimate,
        grace=kw.pop("grace", 1.0),
        **kw,
    )


def job_spec(todo: Path, workdir: Path, *, time_limit: float = 60.0,
             margin: float | None = None, name: str = "worker") -> JobSpec:
    """A light worker job for the local back-end."""
    argv = [*WORKER, str(todo), "--time-limit", repr(time_limit)]
    if margin is not None:
        argv += ["--margin", repr(margin)]
    return JobSpec(name, tuple(argv), time_limit, str(workdir))


def side_effects(ctl: Path) -> list[tuple[str, int, int]]:
    """(task, token, time ns) of every side-effect line, in file order."""
    path = ctl / "side.txt"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        task, token, t = line.split()
        out.append((task, int(token), int(t)))
    return out


def records(ctl: Path) -> list[dict[str, Any]]:
    path = ctl / "records.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def flag(ctl: Path, name: str, task: str, content: str = "") -> Path:
    p = ctl / f"{name}-{task}"
    p.write_text(content)
    return p


def make_fifo(ctl: Path, name: str = "fifo") -> Path:
    p = ctl / name
    os.mkfifo(p)
    return p


def require_slurm() -> None:
    """Skip a test marked ``slurm`` when no cluster answers, with the reason.

    With ``CI=true`` in the environment the test FAILS with the reason instead:
    CI starts a cluster (``.ci/setup-slurm.sh``) and the SLURM tests may not
    silently turn into skips there (the rule of ``tests/needs.py``). Called by
    ``tests/conftest.py`` for every test marked ``slurm``.
    """
    from ensio.workflow.backends.slurm import slurm_unavailable_reason

    needs.capability("SLURM", slurm_unavailable_reason())
