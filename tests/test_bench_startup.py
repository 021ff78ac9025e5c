"""``ensio bench startup`` and the lazy-import rules that keep ensio processes fast.

Why: start-up time is lost one import at a time (issue 24: numba, scipy.spatial,
MPI and netCDF in every process). The times themselves are not asserted (this
machine is shared); what is asserted is what makes them short: which heavy
libraries each entry point has loaded when it is ready, in a fresh interpreter.
The bench is checked for its JSON (keys, the medians of its own runs, the
differences, ratios and verdicts derived from them) and its table.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from transfer_support import SRC, interposer_cache_fixture  # noqa: F401  (a fixture)

from ensio import __version__
from ensio.bench.startup import ANALYSE_READY, KEYS, TARGETS

#: Heavy libraries, by the module names sys.modules holds once they are imported.
NUMERIC = ("numpy", "scipy", "numba", "mpi4py", "netCDF4", "h5py", "matplotlib")


def _loaded_after(code: str) -> set[str]:
    """Top-level and ``scipy.spatial`` names in sys.modules after ``code``, fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        names = {m.split(".")[0] for m in sys.modules} | (
            {"scipy.spatial"} if "scipy.spatial" in sys.modules else set())
        names |= {m for m in sys.modules if m.startswith("ensio.")}
        print("MODULES=" + json.dumps(sorted(names)))
        """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=SRC).stdout
    line = next(x for x in out.splitlines() if x.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


def _exits(code: str) -> str:
    """``code`` wrapped so that the SystemExit of an argparse-style exit is swallowed."""
    return f"try:\n{textwrap.indent(textwrap.dedent(code), '    ')}\nexcept SystemExit:\n    pass\n"


# entry point -> (code run in a fresh interpreter, modules it must not have loaded)
RULES = {
    # --version answers before any sub-command parser (each imports its module)
    "ensio --version": (_exits("from ensio.cli.main import main\nmain(['--version'])"),
                        (*NUMERIC, "yaml", "ensio.cli.analyse", "ensio.cli.worker",
                         "ensio.config.schema")),
    # a pool worker up to its to-do list: no numerics, no YAML, no MPI
    "python -m ensio.cli.worker LIST": (
        _exits("from ensio.cli.worker import main\n"
               "main(['/nonexistent-ensio-dir/todo', '--quiet'])"),
        (*NUMERIC, "yaml", "ensio.offline", "ensio.analysis")),
    # ensio run --transfer sets variables and execs: stdlib, PyYAML, no daemon module
    "ensio run --transfer (parser, prepare's imports)": (
        _exits("from ensio.cli.main import build_parser\nbuild_parser(('run',))\n"
               "import ensio.transfer.run"),
        (*NUMERIC, "ensio.transfer.daemon", "ensio.transfer.network", "ensio.config.schema")),
    # ensio analyse until it reads: MPI, numpy and netCDF yes; no kernels, no k-d tree
    "ensio analyse ready to read": (
        ANALYSE_READY + "\nfrom ensio.cli.main import build_parser\nbuild_parser(('analyse',))",
        ("numba", "scipy", "matplotlib", "ensio.analysis.taperfused",
         "ensio.analysis.eigensolver", "ensio.analysis.winterp_bands")),
    # the analysis package: its kernels and scipy.spatial load where an analysis uses them
    "import ensio.analysis.inputs": ("import ensio.analysis, ensio.analysis.inputs",
                                     ("numba", "scipy.spatial", "matplotlib")),
    # every process imports ensio.errors (ConfigError): no schema, no PyYAML
    "import ensio.errors, ensio.config": ("import ensio.errors, ensio.config",
                                          (*NUMERIC, "yaml", "ensio.config.schema",
                                           "ensio.config.load")),
}


@pytest.mark.parametrize("entry", list(RULES))
def test_entry_point_does_not_import_what_it_does_not_need(entry):
    code, forbidden = RULES[entry]
    loaded = _loaded_after(code)
    assert any(m.startswith("ensio.") for m in loaded), f"{entry}: the probe imported no ensio"
    assert sorted(set(forbidden) & loaded) == [], f"{entry} imported {set(forbidden) & loaded}"


def test_analyse_ready_probe_loads_what_reading_needs():
    """The analyse probe is not trivially light: it holds MPI, numpy and the reader."""
    loaded = _loaded_after(ANALYSE_READY)
    assert {"mpi4py", "numpy", "netCDF4", "yaml", "ensio.offline",
            "ensio.io.modes.ensemble"} <= loaded


def test_fast_version_prints_what_argparse_prints():
    """``ensio --version`` skips the parsers but says what their version action said."""
    fast = subprocess.run([sys.executable, "-m", "ensio.cli.main", "--version"],
                          capture_output=True, text=True, cwd=SRC)
    full = subprocess.run(
        [sys.executable, "-c", "from ensio.cli.main import build_parser\n"
                               "build_parser().parse_args(['--version'])"],
        capture_output=True, text=True, cwd=SRC)
    assert (fast.returncode, fast.stdout, fast.stderr) == (0, f"ensio {__version__}\n", "")
    assert (full.returncode, full.stdout, full.stderr) == (fast.returncode, fast.stdout, "")


def test_warm_covers_every_numba_kernel_module():
    """Every module with cached numba kernels is listed by ``ensio.analysis.warm``
    (its ``cache_files`` names them; its ``warm`` calls their kernels)."""
    from ensio.analysis.warm import KERNEL_MODULES

    analysis = SRC / "ensio" / "analysis"
    with_kernels = {p.stem for p in analysis.glob("*.py")
                    if re.search(r"^@njit\(.*cache=True", p.read_text(), re.M)}
    assert with_kernels and with_kernels == set(KERNEL_MODULES)


def test_warm_check_reports_an_empty_cache_without_compiling(tmp_path: Path):
    """``python -m ensio.cli.warm --check`` on an empty cache: exit 1, nothing listed or built."""
    cache = tmp_path / "numba-cache"
    proc = subprocess.run([sys.executable, "-m", "ensio.cli.warm", "--check"],
                          capture_output=True, text=True, cwd=SRC,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(cache)})
    assert (proc.returncode, proc.stdout) == (1, "")
    assert not cache.exists() or not any(cache.rglob("*.nb*"))


def test_bench_startup_json_and_table(tmp_path: Path, interposer_cache: Path):
    out = tmp_path / "startup.json"
    env = {"XDG_CACHE_HOME": str(interposer_cache), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "ensio.cli.main", "bench", "startup", "--repeat", "3",
         "--json", str(out)], capture_output=True, text=True, cwd=SRC,
        env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["benchmark"] == "startup" and res["repeat"] == 3
    assert set(KEYS.values()) <= set(res)
    assert set(res["runs_ms"]) == set(KEYS)
    base = res["python_ms"]
    for name, key in KEYS.items():
        runs = res["runs_ms"][name]
        assert len(runs) == 3 and all(r > 0 for r in runs)
        assert res[key] == pytest.approx(statistics.median(runs), abs=0.01)
        assert res["min_ms"][key] == pytest.approx(min(runs), abs=0.01)
        assert res["cpu_ms"][key] > 0  # the child's own CPU time, counted at all
        if name == "python":
            continue
        stem = key.removesuffix("_ms")
        assert res[f"{stem}_above_python_ms"] == pytest.approx(res[key] - base, abs=0.02)
        assert res[f"{stem}_ratio"] == pytest.approx(res[key] / base, abs=0.01)
        target = res["targets"][key]
        _, limit, how = TARGETS[name]
        value = res[key] - (base if how == "above_python" else 0.0)
        assert (target["limit_ms"], target["measured"]) == (limit, how)
        assert target["value_ms"] == pytest.approx(value, abs=0.02)
        assert target["met"] == (target["value_ms"] <= limit)
    assert {t[1] for t in TARGETS.values()} == {150.0, 500.0, 100.0}
    assert res["machine"]["cpu_model"] and res["machine"]["logical_cpus"] >= 1
    assert len(res["load_average"]) == 3
    for label in ("ensio --version", "ensio analyse (ready to read)", "ensio worker (ready)",
                  "ensio run --transfer"):
        assert label in proc.stdout
    assert re.search(r"bare Python \d+ ms", proc.stdout)
