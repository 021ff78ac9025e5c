"""The store contract as a package (``ensio.testing``) and the formats' privacy.

Why: a format written outside ensio must be able to run the same contract as
ensio's own formats, so it ships in ``src/ensio/testing``; but it imports
pytest, so nothing in ensio may import it. And since every format-specific
part of the scan is an optional ``MemberStore`` hook, no module outside a
format's own branches on a format's name.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ensio
import ensio.testing
from ensio.io.formats.open import BACKENDS
from ensio.io.formats.store import MemberStore

SRC = Path(ensio.__file__).parent
FORMAT_MODULES = {SRC / "io" / "formats" / f"{name}.py" for name in BACKENDS}


def _imported(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = ".".join(("ensio", *path.relative_to(SRC).with_suffix("").parts[:-1]))
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


def test_nothing_in_ensio_imports_ensio_testing():
    modules = [p for p in SRC.rglob("*.py") if "testing" not in p.relative_to(SRC).parts]
    assert len(modules) > 100  # the walk found the package
    offenders = [str(p.relative_to(SRC)) for p in modules
                 if any(n == "ensio.testing" or n.startswith("ensio.testing.")
                        for n in _imported(p))]  # fmt: skip
    assert offenders == []


def test_import_resolution_sees_relative_imports():
    """The walk above would notice ``from ..testing import x`` (a check that can fail)."""
    path = SRC / "io" / "scan" / "quickcheck.py"
    assert "ensio.io.formats.open" in _imported(path)
    assert "ensio.errors" in _imported(path)


def test_no_branch_on_a_format_name_outside_its_module():
    pattern = re.compile(r"format_name\s*(==|!=|\bin\b)")
    hits = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p not in FORMAT_MODULES
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]  # fmt: skip
    assert hits == []
    assert pattern.search('if store.format_name == "netcdf4":')  # the pattern can fail


def test_the_contract_ships_with_its_hooks():
    contract = ensio.testing.MemberStoreContract
    tests = [n for n in dir(contract) if n.startswith("test_")]
    assert len(tests) >= 15
    assert callable(contract.create) and callable(contract.reference)
    assert ensio.testing.pytest_generate_tests.__module__ == "ensio.testing.store_contract"


@pytest.mark.parametrize("hook", ["metadata_bytes", "quick_look"])
def test_optional_hooks_default_to_not_supported(tmp_path, hook):
    """A format that overrides nothing gets no byte comparison and no quick look."""

    class Bare(MemberStore):
        format_name = "bare"

        @classmethod
        def sniff(cls, head: bytes) -> bool:
            return False

        def variables(self):  # pragma: no cover - never opened
            return {}

        read_elements = write_elements = close = variables

    path = tmp_path / "x"
    path.write_bytes(b"0" * 16)
    if hook == "metadata_bytes":
        assert Bare.metadata_bytes(0, path, {}) is None
    else:
        assert Bare.quick_look(path, {"x": ("n",)}) is None
    assert Bare.byte_pieces(path, {}) == {}


OUTSIDE = '''
from ensio.io.formats.classic import ClassicStore
from ensio.testing import MemberStoreContract, pytest_generate_tests, rng  # noqa: F401


class TestAFormatOutsideEnsio(MemberStoreContract):
    store_class = ClassicStore
    kinds = ("cdf5",)
    always_big_endian = True
'''


def test_the_contract_runs_outside_ensios_test_suite(tmp_path, rng):
    """A test module elsewhere (no conftest of ours, ensio.testing's own rng) runs every test."""
    (tmp_path / "test_outside.py").write_text(OUTSIDE)
    seed = str(int(rng.integers(2**62)))
    env = {**os.environ, "ENSIO_TEST_SEED": seed, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--rootdir", str(tmp_path), str(tmp_path / "test_outside.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    tests = len([n for n in dir(ensio.testing.MemberStoreContract) if n.startswith("test_")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"{tests} passed" in done.stdout, done.stdout[-2000:]
