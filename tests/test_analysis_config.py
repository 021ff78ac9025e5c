"""Config sections of the analysis, converted the way the YAML loader does it."""

from __future__ import annotations

import typing

import pytest
import yaml

from ensio.config.analysis import (
    GLOBAL_FILTERS,
    LOCAL_FILTERS,
    AnalysisSection,
    FilterName,
    InflationSection,
    LocalizationSection,
    ObservationFile,
    OutputSection,
)
from ensio.config.load import from_plain
from ensio.config.schema import ConfigError

ISSUE_EXAMPLE = """
observations:
  - file: obs.nc
analysis:
  filter: letkf
  localization: {taper: gaspari-cohn, radius_km: 5000}
  inflation: {forget: 1.0}
  rotate: false
  kernel: batched
  qc: {max_sigma: 5.0}
output:
  members: an/mem{member:03d}.nc
  mean: an/mean.nc
  spread: an/spread.nc
"""


def test_issue_example_converts():
    raw = yaml.safe_load(ISSUE_EXAMPLE)
    obs = from_plain(tuple[ObservationFile, ...], raw["observations"], "observations")
    ana = from_plain(AnalysisSection, raw["analysis"], "analysis")
    out = from_plain(OutputSection, raw["output"], "output")
    assert obs == (ObservationFile("obs.nc"),)
    assert ana.filter == "letkf" and ana.localization.radius_km == 5000.0
    assert ana.localization.support_radius == 5000.0
    assert ana.qc.max_sigma == 5.0 and ana.kernel == "batched"
    assert out.members == "an/mem{member:03d}.nc"


def test_other_forms_convert():
    ana = from_plain(
        AnalysisSection,
        {
            "filter": "lenkf",
            "localization": {"taper": "step", "radius": 15, "periodic": 40, "regulated": True},
            "inflation": {"rtps": 0.5},
            "seed": 3,
        },
        "analysis",
    )
    assert ana.localization.periodic == 40 and ana.localization.regulated
    assert ana.inflation.rtps == 0.5 and ana.seed == 3
    ana = from_plain(
        AnalysisSection, {"filter": "estkf", "inflation": {"adaptive": True}}, "analysis"
    )
    assert ana.inflation.adaptive and ana.localization is None
    raw = yaml.safe_load("{filter: letkf, localization: {radius_km: .inf}}")
    inf = from_plain(AnalysisSection, raw, "analysis")
    assert inf.localization.radius_km == float("inf")


def test_filter_names_are_complete():
    assert set(typing.get_args(FilterName)) == GLOBAL_FILTERS | LOCAL_FILTERS


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"filter": "letkf", "localization": {"radius_km": 0}}, "analysis.localization.radius_km:"),
        ({"filter": "letkf", "localization": {"radius": -1}}, "analysis.localization.radius:"),
        (
            {"filter": "letkf", "localization": {"radius_km": 1, "radius": 1}},
            "analysis.localization:",
        ),
        ({"filter": "letkf", "localization": {"taper": "gc"}}, "analysis.localization.taper:"),
        (
            {"filter": "letkf", "localization": {"radius_km": 9, "periodic": 40}},
            "analysis.localization.periodic:",
        ),
        (
            {"filter": "letkf", "localization": {"radius": 9, "periodic": 0}},
            "analysis.localization.periodic:",
        ),
        ({"filter": "letkf"}, "analysis.localization:"),
        ({"filter": "etkf", "localization": {"radius_km": 9}}, "analysis.localization:"),
        ({"filter": "kf"}, "analysis.filter:"),
        ({}, "analysis.filter:"),
        ({"filter": "etkf", "kernel": "fast"}, "analysis.kernel:"),
        ({"filter": "etkf", "inflation": {"forget": 1.2}}, "analysis.inflation.forget:"),
        ({"filter": "etkf", "inflation": {"forget": 0}}, "analysis.inflation.forget:"),
        ({"filter": "etkf", "inflation": {"rtpp": 1.5}}, "analysis.inflation.rtpp:"),
        ({"filter": "etkf", "inflation": {"rtpp": 0.5, "rtps": 0.5}}, "analysis.inflation:"),
        (
            {"filter": "etkf", "inflation": {"adaptive": True, "forget": 0.9}},
            "analysis.inflation.adaptive:",
        ),
        (
            {"filter": "etkf", "inflation": {"adaptive_sigma": 0}},
            "analysis.inflation.adaptive_sigma:",
        ),
        ({"filter": "etkf", "qc": {"max_sigma": -2}}, "analysis.qc.max_sigma:"),
        ({"filter": "etkf", "seed": -1}, "analysis.seed:"),
        ({"filter": "etkf", "rotate": "yes"}, "analysis.rotate:"),
        ({"filter": "etkf", "tile_points": 0}, "analysis.tile_points:"),
        ({"filter": "etkf", "threads": 0}, "analysis.threads:"),
    ],
)
def test_bad_analysis_config_names_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        from_plain(AnalysisSection, data, "analysis")
    assert str(err.value).startswith(key), str(err.value)


def test_bad_output_and_observations_name_the_key():
    with pytest.raises(ConfigError, match=r"^output\.members:"):
        OutputSection(members="an/mem.nc")
    with pytest.raises(ConfigError, match=r"^output\.mean:"):
        OutputSection(mean=" ")
    with pytest.raises(ConfigError, match=r"^observations\.file:"):
        ObservationFile("")


def test_sections_are_frozen():
    s = InflationSection()
    with pytest.raises(AttributeError):
        s.forget = 0.5  # type: ignore[misc]
    assert LocalizationSection(radius=3.0).support_radius == 3.0


def test_filter_names_load_without_numpy():
    """Worker jobs load the config: the filter-name registry must not pull numpy in."""
    import subprocess
    import sys

    code = (
        "import sys, typing; import ensio.config.analysis as a; "
        "assert 'numpy' not in sys.modules, 'numpy imported'; "
        "print(sorted(typing.get_args(a.FilterName)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(sorted(GLOBAL_FILTERS | LOCAL_FILTERS))
