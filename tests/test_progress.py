"""Progress bars: on a terminal (standard error a pty) they appear; piped, not a byte."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from ensio.progress import PhaseProgress, no_progress

ENSIO = [sys.executable, "-m", "ensio"]
#: Control characters other than newline and tab (escape sequences, carriage returns).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _Pty:
    """A pseudo-terminal: ``slave`` is a terminal stream, ``master`` is drained by a thread."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        self.slave_fd = slave
        self.data = bytearray()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every slave descriptor is closed
                return
            if not chunk:
                return
            self.data += chunk

    def close_slave(self) -> None:
        if self.slave_fd is not None:
            os.close(self.slave_fd)
            self.slave_fd = None

    def text(self) -> str:
        self.close_slave()
        self._thread.join()
        os.close(self.master)
        return self.data.decode(errors="replace")


def test_disabled_writes_nothing_and_yields_a_no_op():
    out = io.StringIO()
    with PhaseProgress(enabled=False, stream=out) as progress:
        with progress.phase("read", 3, "members") as advance:
            assert advance is no_progress
            advance()
    assert out.getvalue() == ""


def test_enabled_only_on_rank_0_of_a_terminal():
    term = _Pty()
    try:
        with os.fdopen(os.dup(term.slave_fd), "w") as tty:
            assert PhaseProgress.for_rank(0, tty).enabled
            assert not PhaseProgress.for_rank(1, tty).enabled
        assert not PhaseProgress.for_rank(0, io.StringIO()).enabled
        with open(os.devnull, "w") as null:
            assert not PhaseProgress.for_rank(0, null).enabled
    finally:
        term.text()


def test_bar_is_drawn_on_a_terminal():
    term = _Pty()
    with os.fdopen(os.dup(term.slave_fd), "w") as tty:
        with PhaseProgress(enabled=True, stream=tty) as progress:
            with progress.phase("read", 3, "members") as advance:
                advance()  # add_task draws the bar at once (no timing involved)
    text = term.text()
    assert "read" in text and "0/3 members" in text, text
    assert "\x1b[" in text  # drawn and erased with escape sequences (transient bar)


def _synth(root: Path, members: int = 6) -> Path:
    res = subprocess.run([*ENSIO, "synth", str(root), "--nx", "64", "--ny", "32",
                          "--members", str(members), "--seed", "11"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return root / "ensio.yaml"


def _env() -> dict[str, str]:
    return {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}


def test_analyse_shows_bars_on_a_terminal(tmp_path):
    config = _synth(tmp_path)
    term = _Pty()
    proc = subprocess.Popen([*ENSIO, "analyse", str(config)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=term.slave_fd, env=_env())
    term.close_slave()
    stdout, _ = proc.communicate(timeout=300)
    err = term.text()
    assert proc.returncode == 0, err
    assert "read" in err and "/6 members" in err, err
    assert "write" in err and "analysis" in err, err
    out = stdout.decode()
    assert not CONTROL.search(out), out  # the log (stdout, piped) stays plain
    assert out.splitlines()[0].startswith("observations:")


def test_analyse_and_synth_piped_write_no_control_characters(tmp_path):
    res = subprocess.run([*ENSIO, "synth", str(tmp_path), "--nx", "64", "--ny", "32",
                          "--members", "4", "--seed", "2"], capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert not CONTROL.search(res.stderr + res.stdout), (res.stderr, res.stdout)
    res = subprocess.run([*ENSIO, "analyse", str(tmp_path / "ensio.yaml")],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert not CONTROL.search(res.stdout), res.stdout


def test_synth_shows_its_bar_on_a_terminal(tmp_path):
    term = _Pty()
    proc = subprocess.Popen([*ENSIO, "synth", str(tmp_path), "--nx", "16", "--ny", "8",
                             "--members", "3", "--seed", "1"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=term.slave_fd, env=_env())
    term.close_slave()
    stdout, _ = proc.communicate(timeout=120)
    err = term.text()
    assert proc.returncode == 0, err
    assert "/3 members" in err, err
    assert stdout.decode().startswith("wrote 3 members")
    with netCDF4.Dataset(tmp_path / "mem003.nc") as ds:
        assert np.isfinite(ds["state"][:]).all()


@pytest.mark.parametrize("rank", [1, 3])
def test_other_ranks_never_draw(rank):
    term = _Pty()
    with os.fdopen(os.dup(term.slave_fd), "w") as tty:
        with PhaseProgress.for_rank(rank, tty) as progress:
            with progress.phase("read", 2, "members") as advance:
                advance(2)
    assert term.text() == ""
