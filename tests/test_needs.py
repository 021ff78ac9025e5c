"""tests/needs.py: a missing need skips locally and FAILS under CI=true, before fixtures.

Each case runs a small test file in a fresh pytest session (pytester, in process)
without ``CI`` and with ``CI=true``, and checks each test's outcome and reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
MISSING_TOOL = "ensio-test-no-such-program"

CONFTEST = """
import needs

def pytest_configure(config):
    needs.register(config)

def pytest_runtest_setup(item):
    needs.run_marks(item)
"""


@pytest.fixture
def tester(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(HERE)
    pytester.makeconftest(CONFTEST)
    return pytester


def _outcomes(tester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
              ci: bool) -> dict[str, tuple[str, str]]:
    """Test name → (outcome, report text) of a run: the first phase that did not pass
    (a mark's check fails in setup), else the call."""
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    rec = tester.inline_run("-p", "no:cacheprovider")
    out: dict[str, tuple[str, str]] = {}
    for r in rec.getreports("pytest_runtest_logreport"):
        if r.when == "call" or r.outcome != "passed":
            out.setdefault(r.nodeid.split("::")[-1], (r.outcome, str(r.longrepr or "")))
    return out


def _missing(ci: bool, text: str) -> tuple[str, str]:
    """A missing need: skipped with ``needs …``, or failed with ``CI=true requires …``."""
    return ("failed", f"CI=true requires {text}") if ci else ("skipped", f"needs {text}")


def _check(got: dict[str, tuple[str, str]], want: dict[str, tuple[str, str]]) -> None:
    assert sorted(got) == sorted(want)
    for name, (outcome, text) in want.items():
        assert got[name][0] == outcome, (name, got[name])
        assert text in got[name][1], (name, got[name])


@pytest.mark.parametrize("ci", [False, True], ids=["local", "CI=true"])
def test_a_missing_tool_skips_locally_and_fails_in_ci(tester, monkeypatch, ci):
    tester.makepyfile(test_tool=f"""
import needs

def test_called():
    needs.tool("sh", "{MISSING_TOOL}")

@needs.tools_mark("{MISSING_TOOL}")
def test_marked():
    pass

def test_present():
    needs.tool("sh")
""")
    _check(_outcomes(tester, monkeypatch, ci), {
        "test_called": _missing(ci, f"sh, {MISSING_TOOL} on PATH: not found: {MISSING_TOOL}"),
        "test_marked": _missing(ci, f"{MISSING_TOOL} on PATH: not found: {MISSING_TOOL}"),
        "test_present": ("passed", ""),
    })


@pytest.mark.parametrize("ci", [False, True], ids=["local", "CI=true"])
def test_a_module_mark_runs_before_the_fixtures(tester, monkeypatch, ci):
    """A ``pytestmark`` need stops the test before a (costly) module fixture is built."""
    built = tester.path / "built"
    tester.makepyfile(test_mark=f"""
import pytest
import needs

pytestmark = needs.mark(needs.capability, "a capability", "this machine lacks it")

@pytest.fixture(scope="module")
def costly():
    open({str(built)!r}, "w").close()

def test_one(costly):
    pass
""")
    _check(_outcomes(tester, monkeypatch, ci),
           {"test_one": _missing(ci, "a capability: this machine lacks it")})
    assert not built.exists()


@pytest.mark.parametrize("ci", [False, True], ids=["local", "CI=true"])
def test_only_the_module_s_own_absence_is_a_need(tester, monkeypatch, ci):
    """``needs.module``: the module missing skips (fails in CI); a module that is there
    but breaks on import fails everywhere, never a skip."""
    tester.makepyfile(broken_mod="import ensio_test_no_such_dependency\n")
    tester.makepyfile(test_mod="""
import needs

def test_absent():
    needs.module("ensio_test_no_such_module.sub")

def test_broken():
    needs.module("broken_mod")

def test_present():
    assert needs.module("json").dumps(1) == "1"
""")
    _check(_outcomes(tester, monkeypatch, ci), {
        "test_absent": _missing(ci, "the Python module ensio_test_no_such_module.sub"),
        "test_broken": ("failed", "No module named 'ensio_test_no_such_dependency'"),
        "test_present": ("passed", ""),
    })


@pytest.mark.parametrize("ci", [False, True], ids=["local", "CI=true"])
def test_root_and_venv_tool(tester, monkeypatch, ci):
    """``needs.root`` looks at the effective uid; ``needs.venv_tool`` next to the interpreter."""
    tester.makepyfile(test_root=f"""
import os
import needs

def test_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    needs.root("mount a tmpfs")

def test_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    needs.root("mount a tmpfs")

def test_no_venv_tool():
    needs.venv_tool("{MISSING_TOOL}", path_fallback=True)
""")
    _check(_outcomes(tester, monkeypatch, ci), {
        "test_not_root": _missing(ci, "root to mount a tmpfs: running as uid 1000"),
        "test_root": ("passed", ""),
        "test_no_venv_tool": _missing(ci, f"{MISSING_TOOL} next to "),
    })
