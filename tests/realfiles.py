"""Member ensembles built with CDO and NCO, the way models and post-processing write restarts.

Every file here is made by the real tools (``cdo``, ``ncap2``, ``ncatted``,
``ncpdq``, ``ncks``, ``nccopy``, ``ncgen``) run as subprocesses, never by
ensio's writers. A builder returns a :class:`Scenario`: the member paths, the
config dict for ``ensio analyse``, and the CLEAN arrays the test compares
with: physical values (unpacked in numpy from the raw values netCDF4 reads
with auto-scaling off) and the inactive points (any member missing there).

Grid: CDO's ``r36x18`` (lon 0..350 by 10, lat -85..85 by 10). Member m's
fields are a smooth base plus two large-scale waves with member-specific
amplitudes and phases (drawn from the scenario's seed) plus CDO's
``random`` noise, so the ensemble anomalies are spatially correlated and the
analysis moves every point near an observation.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import netCDF4
import numpy as np
import yaml

__all__ = [
    "GRID", "LEVELS", "Obs", "Scenario", "run", "plain", "extra_metadata", "chunked",
    "time_record", "packed", "offset_only", "missing", "curvilinear", "masked",
    "write_observations", "clean_values",
]  # fmt: skip

GRID = "r36x18"
NLON, NLAT = 36, 18
LEVELS = (85000.0, 50000.0, 25000.0)
RADIUS_KM = 3000.0
#: Grid description CDO reads with ``setzaxis``: pressure levels (Pa).
ZAXIS = "zaxistype = pressure\nsize = 3\nlevels = " + " ".join(f"{v:.0f}" for v in LEVELS) + "\n"


def run(*cmd: object, cwd: Path | None = None) -> str:
    """Run a tool; a failure raises with its stderr (so a broken builder is obvious)."""
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=60
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stderr}")
    return proc.stdout


@dataclass
class Obs:
    """Observations as written to ``path`` (and, for the reference, as arrays)."""

    path: Path
    lon: np.ndarray
    lat: np.ndarray
    value: np.ndarray
    error: np.ndarray
    index: np.ndarray | None = None
    entry: dict = field(default_factory=dict)  # extra keys of the config entry
    #: expected horizontal H per observation, ``(flat indices, weights)``, when the
    #: builder knows it by construction (curvilinear); else bilinear on 1-D axes
    h: list | None = None


@dataclass
class Scenario:
    """Members built by the tools, the analysis config, and the clean arrays.

    ``clean[name]``: (k, *shape) float64 physical values of every member;
    ``inactive[name]``: bool (*shape), True where any member is missing (or
    the point is masked out). ``lon``/``lat``: the horizontal grid (1-D axes,
    or 2-D for curvilinear). ``levels``: the level axis of 3-D variables.
    """

    root: Path
    paths: list[Path]
    state: list[str]
    clean: dict[str, np.ndarray]
    inactive: dict[str, np.ndarray]
    lon: np.ndarray
    lat: np.ndarray
    obs: list[Obs]
    config: dict
    levels: np.ndarray | None = None
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    def write_config(self) -> Path:
        path = self.root / "ensio.yaml"
        path.write_text(yaml.safe_dump(self.config))
        return path

    @property
    def k(self) -> int:
        return len(self.paths)


def clean_values(path: Path, name: str) -> np.ndarray:
    """Physical values of ``name`` in ``path``: raw * scale_factor + add_offset, in float64."""
    with netCDF4.Dataset(path) as ds:
        var = ds[name]
        var.set_auto_maskandscale(False)
        raw = np.asarray(var[...])
        attrs = {a: var.getncattr(a) for a in var.ncattrs()}
    x = raw.astype(np.float64)
    if "scale_factor" in attrs:
        x = x * np.float64(attrs["scale_factor"])
    if "add_offset" in attrs:
        x = x + np.float64(attrs["add_offset"])
    return x


def _waves(name: str, base: str, rng: np.random.Generator, noise: float) -> str:
    """A CDO ``expr`` for one member: base + two waves with random phase/amplitude + noise."""
    a1, a2 = (float(v) for v in rng.uniform(0.5, 2.0, 2))
    p1, p2 = (float(v) for v in rng.uniform(0.0, 360.0, 2))
    lat, lon = "rad(clat(random))", "rad(clon(random))"
    return (
        f"{name}={base}+{a1!r}*cos({lat})*sin({lon}+rad({p1!r}))"
        f"+{a2!r}*sin(2*{lat})*cos(2*{lon}+rad({p2!r}))+{noise!r}*(random-0.5)"
    )


def _statics(path: Path) -> None:
    """Add the static fields every member carries: ``orog`` (float) and ``lsm`` (byte)."""
    tmp = path.with_suffix(".tmp.nc")
    run("ncap2", "-O", "-s",
        "orog[$lat,$lon]=float(1000*cos(lat*0.0174533)*cos(lon*0.0349066)^2);"
        "lsm[$lat,$lon]=0b; where(orog > 400.0f) lsm=1b;", path, tmp)  # fmt: skip
    run("ncatted", "-O", "-a", "axis,orog,d,,", "-a", "standard_name,orog,o,c,surface_altitude",
        "-a", "long_name,orog,o,c,surface altitude", "-a", "units,orog,o,c,m",
        "-a", "long_name,lsm,c,c,land-sea mask (1 = land)", tmp)  # fmt: skip
    tmp.replace(path)


def _cdo_member(
    path: Path,
    rng: np.random.Generator,
    seed: int,
    *,
    bits: str = "F64",
    post: tuple[str, ...] = (),
    time: bool = False,
    level: bool = False,
) -> None:
    """One member as CDO writes it: ``sst`` (+ ``t`` on 3 levels), a non-state ``u``.

    ``time`` keeps a time record dimension (``settaxis``); otherwise CDO's
    ``--reduce_dim`` drops it. ``post`` are CDO operators applied last
    (``-invertlat``, ``-sellonlatbox,...``).
    """
    d = path.parent
    opts = ["-s", "-f", "nc4", "-b", bits] + ([] if time else ["--reduce_dim"])
    taxis = ["-settaxis,2020-01-01,00:00:00,6hour"] if time else []
    two = d / f".{path.stem}.2d.nc"
    run("cdo", *opts, *taxis, *post, "-merge",
        "-expr," + _waves("sst", "280+15*cos(rad(clat(random)))", rng, 0.6),
        f"-random,{GRID},{seed}",
        "-expr," + _waves("u", "5*sin(rad(clat(random)))", rng, 1.0),
        f"-random,{GRID},{seed + 1}", two)  # fmt: skip
    if not level:
        two.replace(path)
    else:
        zaxis = d / ".zaxis.txt"
        zaxis.write_text(ZAXIS)
        levs = []
        for i, p in enumerate(LEVELS):
            levs += [f"-setlevel,{p:.0f}", f"-random,{GRID},{seed + 2 + i}"]
        expr = _waves("t", "200+0.001*clev(random)+20*cos(rad(clat(random)))", rng, 0.8)
        three = d / f".{path.stem}.3d.nc"
        run("cdo", *opts, *taxis, *post, "-expr," + expr,
            "-genlevelbounds", f"-setzaxis,{zaxis}", "-merge", *levs, three)  # fmt: skip
        run("cdo", *opts, "merge", two, three, path)
        two.unlink()
        three.unlink()
    _statics(path)
    run("ncatted", "-O", "-h", "-a", f"title,global,o,c,restart of member {path.stem}", path)


#: Where built member sets are kept for reuse (set by a module fixture of
#: tests/test_real_files.py); ``None``: every call builds.
MEMBER_CACHE: Path | None = None


def _members(root: Path, seed: int, k: int, **kw) -> list[Path]:
    """``k`` CDO members in ``root``; copies of an earlier build with the same arguments.

    Why the cache: the tools take seconds per member set (10 s for the 3-D
    ``time_record`` members), and several tests differ only in what they do
    with the same members; a copy is byte-identical to a fresh build.
    """
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"mem{m:03d}.nc" for m in range(1, k + 1)]
    key = f"s{seed}-k{k}-" + "-".join(f"{a}={kw[a]}" for a in sorted(kw))
    built = None if MEMBER_CACHE is None else MEMBER_CACHE / hashlib.sha256(
        key.encode()).hexdigest()[:16]
    if built is not None and built.is_dir():
        for p in paths:
            shutil.copyfile(built / p.name, p)
        return paths
    rng = np.random.default_rng(seed)
    for m, p in enumerate(paths):
        _cdo_member(p, rng, seed * 1000 + 10 * m + 1, **kw)
    if built is not None:
        tmp = built.with_suffix(".tmp")
        tmp.mkdir(parents=True)
        for p in paths:
            shutil.copyfile(p, tmp / p.name)
        tmp.rename(built)
    return paths


def _axes(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with netCDF4.Dataset(path) as ds:
        lev = np.asarray(ds["plev"][:], dtype=float) if "plev" in ds.variables else None
        return np.asarray(ds["lon"][:], float), np.asarray(ds["lat"][:], float), lev


def write_observations(path: Path, obs: dict[str, np.ndarray], fmt: str = "nc4") -> None:
    """An observation file written by ``ncgen`` from CDL (dim ``obs``; the given variables)."""
    m = obs["value"].size
    lines = ["netcdf obs {", "dimensions:", f"  obs = {m} ;", "variables:"]
    units = {"lon": "degrees_east", "lat": "degrees_north"}
    for name in obs:
        kind = "int" if name == "index" else "double"
        lines.append(f"  {kind} {name}(obs) ;")
        if name in units:
            lines.append(f'    {name}:units = "{units[name]}" ;')
    lines.append("data:")
    for name, arr in obs.items():
        vals = ", ".join(str(int(v)) if name == "index" else repr(float(v)) for v in arr)
        lines.append(f"  {name} = {vals} ;")
    lines.append("}")
    cdl = path.with_suffix(".cdl")
    cdl.write_text("\n".join(lines) + "\n")
    run("ncgen", "-k", fmt, "-o", path, cdl)


def _lonlat_obs(rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Random locations away from the grid's latitude edges (±85)."""
    return rng.uniform(0.0, 360.0, m), rng.uniform(-78.0, 78.0, m)


def _values(rng: np.random.Generator, near: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Observed values: the prior near the location, shifted (bias 1.5) plus noise; errors σ."""
    err = rng.uniform(0.5, 1.0, m)
    return near + 1.5 + err * rng.standard_normal(m), err


def _config(root: Path, k: int, state: list, obs: list[Obs], **ens) -> dict:
    return {
        "ensemble": {"members": str(root / "mem{member:03d}.nc"), "size": k,
                     "variables": state, "coordinates": {"lon": "lon", "lat": "lat"}, **ens},
        "observations": [{"file": str(o.path), **o.entry} for o in obs],
        "analysis": {"filter": "letkf", "localization": {"radius_km": RADIUS_KM}},
        "io": {"journal": True},
        "output": {"mean": str(root / "an" / "mean.nc"), "spread": str(root / "an" / "spread.nc")},
    }  # fmt: skip


def _scenario(
    root: Path,
    paths: list[Path],
    state: list[str],
    obs_rng,
    m: int = 30,
    obs_var: str | None = None,
    **kw,
) -> Scenario:
    """Clean arrays from the files, lon/lat observations of the first variable."""
    lon, lat, lev = _axes(paths[0])
    clean = {v: np.stack([clean_values(p, v) for p in paths]) for v in state}
    inactive = {v: np.zeros(clean[v].shape[1:], bool) for v in state}
    olon, olat = _lonlat_obs(obs_rng, m)
    first = clean[obs_var or state[0]].mean(0).reshape(-1, lat.size, lon.size)[0]
    j = np.abs(lat[None, :] - olat[:, None]).argmin(1)
    i = np.abs((lon[None, :] - olon[:, None] + 180.0) % 360.0 - 180.0).argmin(1)
    near = first[j, i]
    value, err = _values(obs_rng, near, m)
    obs = Obs(root / "obs.nc", olon, olat, value, err)
    write_observations(obs.path, {"lon": olon, "lat": olat, "value": value, "error": err})
    cfg = _config(root, len(paths), list(state), [obs])
    return Scenario(root, paths, list(state), clean, inactive, lon, lat, [obs], cfg, lev, **kw)


# ------------------------------------------------------------------ scenarios


def plain(root: Path, seed: int, *, k: int = 8, bits: str = "F64", post: tuple = ()) -> Scenario:
    """CDO members ``sst(lat, lon)`` (no time dim), a non-state ``u``, static ``orog``/``lsm``.

    ``post`` = ``("-invertlat",)`` gives descending latitude,
    ``("-sellonlatbox,-180,180,-90,90",)`` longitudes -175..175.
    """
    paths = _members(root, seed, k, bits=bits, post=post)
    return _scenario(root, paths, ["sst"], np.random.default_rng(seed + 7))


def extra_metadata(root: Path, seed: int, k: int = 6) -> Scenario:
    """Plain members; one has an extra global and variable attribute, one an extra variable."""
    s = plain(root, seed, k=k)
    run("ncatted", "-O", "-h", "-a", "comment,global,c,c,re-run after a crash",
        "-a", "note,sst,c,c,bias corrected", s.paths[1])  # fmt: skip
    tmp = s.root / ".extra.nc"
    run("ncap2", "-O", "-s", "sst_prev=sst-0.5; sst_prev@long_name=\"previous sst\"",
        s.paths[2], tmp)  # fmt: skip
    tmp.replace(s.paths[2])
    return s


#: How each member is rewritten by ``chunked``: format, chunking and deflation differ.
REWRITES = (
    ("nccopy", "-k", "nc4", "-d", "1", "-c", "lat/6,lon/12"),
    ("nccopy", "-k", "classic"),
    ("nccopy", "-k", "64-bit offset"),
    ("nccopy", "-k", "cdf5"),
    ("ncks", "-O", "-4", "-L", "9", "--cnk_dmn", "lat,3", "--cnk_dmn", "lon,36"),
    ("nccopy", "-k", "nc4", "-d", "5", "-s", "-c", "lat/18,lon/1"),
    ("nccopy", "-k", "nc7"),
    ("ncks", "-O", "-7", "--cnk_plc=all", "--cnk_map=rd1"),
)


def chunked(root: Path, seed: int) -> Scenario:
    """Plain members, each rewritten differently: formats, chunk shapes, deflate 1..9, shuffle."""
    s = plain(root, seed, k=len(REWRITES))
    for p, cmd in zip(s.paths, REWRITES, strict=True):
        tmp = p.with_name(f".{p.name}.re.nc")
        run(*cmd, p, tmp)
        tmp.replace(p)
    return s


def time_record(root: Path, seed: int, *, k: int = 6, bits: str = "F32") -> Scenario:
    """As CDO writes restarts: ``sst(time, lat, lon)``, ``t(time, plev, lat, lon)`` (plev with
    bounds), time an unlimited record dimension of length 1, float32."""
    paths = _members(root, seed, k, bits=bits, time=True, level=True)
    return _scenario(root, paths, ["sst", "t"], np.random.default_rng(seed + 7))


def packed(root: Path, seed: int, k: int = 6) -> Scenario:
    """``ncpdq -P all_new``: every float variable (sst, u, orog) packed to short."""
    s = plain(root, seed, k=k)
    for p in s.paths:
        tmp = p.with_name(f".{p.name}.pk.nc")
        run("ncpdq", "-O", "-P", "all_new", p, tmp)
        tmp.replace(p)
    s.clean = {v: np.stack([clean_values(p, v) for p in s.paths]) for v in s.state}
    return s


def offset_only(root: Path, seed: int, k: int = 6) -> Scenario:
    """float32 ``sst`` stored in °C-like raw units with only ``add_offset = 273.15``."""
    s = plain(root, seed, k=k, bits="F32")
    for p in s.paths:
        tmp = p.with_name(f".{p.name}.off.nc")
        run("ncap2", "-O", "-s", "sst=sst-273.15f", p, tmp)
        run("ncatted", "-O", "-a", "add_offset,sst,c,f,273.15", tmp)
        tmp.replace(p)
    s.clean = {v: np.stack([clean_values(p, v) for p in s.paths]) for v in s.state}
    return s


def _points(rng: np.random.Generator, n: int, nlat: int = NLAT, nlon: int = NLON) -> list:
    """``n`` distinct interior grid points (j, i), away from the latitude edges."""
    flat = rng.choice((nlat - 4) * nlon, n, replace=False)
    return [(int(f // nlon) + 2, int(f % nlon)) for f in flat]


def _ncap2(path: Path, script: str) -> None:
    tmp = path.with_name(f".{path.name}.ncap2.nc")
    run("ncap2", "-O", "-s", script, path, tmp)
    tmp.replace(path)


def missing(root: Path, seed: int, k: int = 6) -> Scenario:
    """Missing data as models and CDO/NCO leave it, in two state variables.

    ``sst`` (float64): ``missing_value = -9e33`` only (CDO's ``_FillValue``
    removed) at points of members 2 and 5, a NaN in member 6, a value outside
    ``valid_range = [250, 330]`` in member 4. ``ssh`` (float64):
    ``_FillValue = NaN`` with NaN points in member 3. Some observations sit
    in cells next to a missing ``sst`` point (their H reads it: dropped).
    """
    s = plain(root, seed, k=k)
    rng = np.random.default_rng(seed + 11)
    pts = _points(rng, 7)
    where = {1: pts[0:2], 4: pts[2:3], 5: pts[3:4], 3: pts[4:5]}  # member index → points
    values = {1: "-9e33", 4: "-9e33", 5: "0.0/0.0", 3: "400.0"}
    for m, p in enumerate(s.paths):
        script = "ssh=sst*0.01-2.8;" + "".join(
            f"sst({j},{i})={values[m]};" for j, i in where.get(m, [])
        )
        if m == 2:
            script += "".join(f"ssh({j},{i})=0.0/0.0;" for j, i in pts[5:7])
        _ncap2(p, script)
        run("ncatted", "-O", "-a", "_FillValue,ssh,o,d,NaN", "-a", "missing_value,ssh,d,,",
            "-a", "long_name,ssh,o,c,sea surface height", "-a", "_FillValue,sst,d,,",
            "-a", "missing_value,sst,o,d,-9e33",
            "-a", "valid_range,sst,c,d,250.,330.", p)  # fmt: skip
    s.state = ["sst", "ssh"]
    s.config["ensemble"]["variables"] = ["sst", "ssh"]
    s.clean = {v: np.stack([clean_values(p, v) for p in s.paths]) for v in s.state}
    s.inactive = {v: np.zeros((NLAT, NLON), bool) for v in s.state}
    for j, i in pts[:5]:
        s.inactive["sst"][j, i] = True
    for j, i in pts[5:7]:
        s.inactive["ssh"][j, i] = True
    # observations whose cell has a missing sst corner: the reference drops them
    near = [(j, i) for j, i in pts[:5]]
    o = s.obs[0]
    o.lon[: len(near)] = [s.lon[i] + 3.0 for _, i in near]
    o.lat[: len(near)] = [s.lat[j] + 3.0 for j, _ in near]
    write_observations(o.path, {"lon": o.lon, "lat": o.lat, "value": o.value, "error": o.error})
    return s


def masked(root: Path, seed: int, k: int = 6, *, index: bool = False) -> Scenario:
    """``{name: sst, mask: sea}`` with ``sea = 1 - lsm`` (a byte variable, 1 = ocean).

    ``index`` writes observations at ocean grid points with their state row
    (H = identity); otherwise lon/lat observations (bilinear; an observation
    whose cell has a land corner is dropped).
    """
    s = plain(root, seed, k=k)
    for p in s.paths:
        _ncap2(p, 'sea=byte(1b-lsm); sea@long_name="sea mask (1 = ocean)";')
    with netCDF4.Dataset(s.paths[0]) as ds:
        sea = np.asarray(ds["sea"][:]) != 0
    s.masks = {"sst": sea}
    s.config["ensemble"]["variables"] = [{"name": "sst", "mask": "sea"}]
    if index:
        rng = np.random.default_rng(seed + 13)
        rows = np.sort(rng.choice(int(sea.sum()), 25, replace=False))
        jj, ii = np.nonzero(sea)  # C order: row r of the state is (jj[r], ii[r])
        near = s.clean["sst"].mean(0)[jj[rows], ii[rows]]
        value, err = _values(rng, near, rows.size)
        o = s.obs[0]
        o.lon, o.lat, o.value, o.error, o.index = s.lon[ii[rows]], s.lat[jj[rows]], value, err, rows
        write_observations(o.path, {"lon": o.lon, "lat": o.lat, "value": value, "error": err,
                                    "index": rows})  # fmt: skip
    return s


def _rotated(rlon: np.ndarray, rlat: np.ndarray, pole_lon: float, pole_lat: float):
    """Geographic lon/lat of rotated-pole coordinates (CF ``rotation_latitude_longitude``)."""
    lo, la = np.radians(rlon), np.radians(rlat)
    x, y, z = np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)
    theta = np.radians(90.0 - pole_lat)  # rotate about y, then about z
    phi = np.radians(pole_lon + 180.0)
    x2 = np.cos(theta) * x + np.sin(theta) * z
    z2 = -np.sin(theta) * x + np.cos(theta) * z
    x3, y3 = np.cos(phi) * x2 - np.sin(phi) * y, np.sin(phi) * x2 + np.cos(phi) * y
    return np.degrees(np.arctan2(y3, x3)), np.degrees(np.arcsin(np.clip(z2, -1, 1)))


def curvilinear(root: Path, seed: int, k: int = 6) -> Scenario:
    """A rotated-pole regional grid written by ``ncgen`` from CDL: ``tas(rlat, rlon)`` with
    auxiliary 2-D ``lon(rlat, rlon)``/``lat(rlat, rlon)`` and a ``rotated_pole`` mapping.

    Observations sit exactly on grid nodes, so H is the identity there under any
    bilinear convention in the cell (the expected H needs no inverse map).
    """
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rlon, rlat = np.arange(-20.0, 20.1, 2.0), np.arange(-15.0, 15.1, 2.0)
    R, Q = np.meshgrid(rlon, rlat)
    lon, lat = _rotated(R, Q, -162.0, 39.25)
    paths, clean = [], []
    for m in range(1, k + 1):
        a, ph = rng.uniform(0.5, 2.0), rng.uniform(0, 2 * np.pi)
        tas = 285 + 10 * np.cos(np.radians(lat)) + a * np.sin(np.radians(3 * lon) + ph)
        tas = tas + 0.3 * rng.standard_normal(tas.shape)
        p = root / f"mem{m:03d}.nc"
        _ncgen_curvilinear(p, rlon, rlat, lon, lat, tas)
        paths.append(p)
        clean.append(clean_values(p, "tas"))
    X = np.stack(clean)
    nodes = np.sort(rng.choice(X[0].size, 20, replace=False))
    value, err = _values(rng, X.mean(0).ravel()[nodes], nodes.size)
    h = [(np.array([n]), np.array([1.0])) for n in nodes]
    obs = Obs(root / "obs.nc", lon.ravel()[nodes], lat.ravel()[nodes], value, err, h=h)
    write_observations(obs.path, {"lon": obs.lon, "lat": obs.lat, "value": value, "error": err})
    cfg = _config(root, k, ["tas"], [obs])
    return Scenario(root, paths, ["tas"], {"tas": X}, {"tas": np.zeros(X.shape[1:], bool)},
                    lon, lat, [obs], cfg)  # fmt: skip


def _ncgen_curvilinear(path, rlon, rlat, lon, lat, tas) -> None:
    def data(a):
        return ", ".join(repr(float(v)) for v in np.ravel(a))

    cdl = f"""netcdf {path.stem} {{
dimensions:
  rlat = {rlat.size} ;
  rlon = {rlon.size} ;
variables:
  double rlat(rlat) ; rlat:standard_name = "grid_latitude" ; rlat:units = "degrees" ;
  double rlon(rlon) ; rlon:standard_name = "grid_longitude" ; rlon:units = "degrees" ;
  char rotated_pole ;
    rotated_pole:grid_mapping_name = "rotation_latitude_longitude" ;
    rotated_pole:grid_north_pole_latitude = 39.25 ;
    rotated_pole:grid_north_pole_longitude = -162. ;
  double lon(rlat, rlon) ; lon:standard_name = "longitude" ; lon:units = "degrees_east" ;
  double lat(rlat, rlon) ; lat:standard_name = "latitude" ; lat:units = "degrees_north" ;
  double tas(rlat, rlon) ;
    tas:standard_name = "air_temperature" ; tas:units = "K" ;
    tas:coordinates = "lon lat" ; tas:grid_mapping = "rotated_pole" ;
    tas:_FillValue = 1.e+20 ;
  :Conventions = "CF-1.8" ;
  :title = "regional restart {path.stem}" ;
data:
  rlat = {data(rlat)} ;
  rlon = {data(rlon)} ;
  lon = {data(lon)} ;
  lat = {data(lat)} ;
  tas = {data(tas)} ;
}}
"""
    cdl_path = path.with_suffix(".cdl")
    cdl_path.write_text(cdl)
    run("ncgen", "-k", "nc4", "-o", path, cdl_path)
    cdl_path.unlink()
