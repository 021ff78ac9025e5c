"""``ensio report``: the table fits 80 columns and never prints ``-0``; the number helpers."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ensio.cli.report import build_table
from ensio.numfmt import fitted, fixed, unsigned_zero

#: A cell that reads as negative zero: "-0", "-0.00", "-0.0e+00" ...
NEGATIVE_ZERO = re.compile(r"(?<![\w.])-0(\.0*)?([eE][+-]?\d+)?(?![\w.])")


@pytest.mark.parametrize(
    ("text", "expect"),
    [("-0", "0"), ("-0.00", "0.00"), ("-0.0e+00", "0.0e+00"), ("-0.", "0."),
     ("-0.01", "-0.01"), ("-10", "-10"), ("-100.00", "-100.00"), ("0.00", "0.00"),
     ("-", "-"), ("", ""), ("-inf", "-inf"), ("-1e-05", "-1e-05")],
)
def test_unsigned_zero(text, expect):
    assert unsigned_zero(text) == expect


def test_fixed_and_fitted():
    assert fixed(-0.0) == "0.00"
    assert fixed(-0.004) == "0.00"
    assert fixed(-1e-9, 0) == "0"
    assert fixed(-0.4, 0) == "0"
    assert fixed(-0.6, 0) == "-1"
    assert fixed(2.345678, 3) == "2.346"
    assert fixed(float("nan")) == "—"
    assert fitted(-123456.25, 10) == "-123456.25"  # 10 characters: fits
    assert fitted(12345678.9, 10) == "1.23e+07"
    assert fitted(-1234567.1, 10) == "-1.23e+06"
    assert fitted(-1e-300, 10) == "0.00"
    assert fitted(-1.7e300, 10) == "-1.70e+300"
    with pytest.raises(ValueError, match="width"):
        fitted(1.0, 9)


def _render(rows: list[dict]) -> list[str]:
    """The table as printed on a wide console: its natural width, not squeezed to 80."""
    out = io.StringIO()
    Console(file=out, width=300, color_system=None).print(build_table(rows))
    return out.getvalue().splitlines()


def _rows(rng, n: int, scale: float) -> list[dict]:
    rows = []
    for c in range(1, n + 1):
        total = float(rng.uniform(0.5, 1.0) * scale)
        queuing = float(rng.choice([-0.0, -1e-7, rng.uniform(0, 0.3) * total]))
        io_s = float(rng.uniform(0, 3.0) * total)  # summed over parallel tasks: may exceed 100 %
        rows.append({"cycle": c * 97, "total": total, "queuing": queuing, "io": io_s,
                     "running": max(0.0, total - queuing - io_s)})
    return rows


@pytest.mark.parametrize("n", [1, 2, 9, 120])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 5e4, 3e7, 4e11])
def test_table_fits_80_columns_and_has_no_negative_zero(rng, n, scale):
    rows = _rows(rng, n, scale)
    lines = _render(rows)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    body = "\n".join(lines)
    assert not NEGATIVE_ZERO.search(body), body
    # every cycle row is there, with its total as fixed or fitted by hand here
    cells = {line.split()[0]: line.split()[1:] for line in lines if line.split()}
    for r in rows:
        total = r["total"]
        want = f"{total:.2f}" if len(f"{total:.2f}") <= 10 else f"{total:.2e}"
        assert cells[str(r["cycle"])][0] == want
    assert "mean" in cells and "sd" in cells


def test_percentages_of_the_total():
    rows = [{"cycle": 1, "total": 10.0, "queuing": 2.5, "io": 0.04, "running": 7.46},
            {"cycle": 2, "total": 10.0, "queuing": 2.5, "io": 150.0, "running": 0.0}]
    cells = {line.split()[0]: line.split()[1:] for line in _render(rows) if line.split()}
    # total, queuing, %, running, %, io, %
    assert cells["1"] == ["10.00", "2.50", "25", "7.46", "75", "0.04", "0"]
    assert cells["2"] == ["10.00", "2.50", "25", "0.00", "0", "150.00", ">999"]
    assert cells["mean"] == ["10.00", "2.50", "25", "3.73", "37", "75.02", "750"]


def test_ensio_report_end_to_end_negative_zero_and_long_numbers(tmp_path):
    recs = []
    for c, (sub, start, end, io_s) in enumerate(
        [(100.0, 100.0000001, 1.2e6, 3.5e5), (2e6, 2e6, 2e6 + 0.004, 0.0)], start=1
    ):
        recs.append({"kind": "member", "cycle": c, "submitted": sub, "started": start,
                     "finished": end, "ended": end, "status": "done", "io_seconds": io_s})
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = subprocess.run([sys.executable, "-m", "ensio", "report", str(tmp_path)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    table = [line for line in res.stdout.splitlines()
             if line.split()[:1] in (["cycle"], ["1"], ["2"], ["mean"], ["sd"])]
    assert len(table) == 5, res.stdout
    assert max(len(line) for line in table) <= 80
    assert not NEGATIVE_ZERO.search(res.stdout), res.stdout
    assert (tmp_path / "report.csv").exists()


def test_report_title_names_the_directory(tmp_path):
    rec = {"kind": "analysis", "cycle": 1, "submitted": 0.0, "started": 1.0, "finished": 3.0,
           "ended": 3.0, "status": "done", "io_seconds": 0.5}
    (tmp_path / "records.jsonl").write_text(json.dumps(rec) + "\n")
    res = subprocess.run([sys.executable, "-m", "ensio", "report", str(tmp_path)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == f"ensio report: {Path(tmp_path)} (1 cycle)"
