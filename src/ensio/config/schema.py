"""Typed, frozen configuration of an ensio run.

Every key a user can write in YAML is a field here; the loader in
:mod:`ensio.config.load` rejects anything else, naming the key. Later features
add their own section dataclasses and a field on :class:`Config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .analysis import AnalysisSection, ObservationFile, OutputSection
from .axes import TimeLevel, check_axes
from .errors import ConfigError
from .plain import SHORT_FORMS
from .workflow import WorkflowSection


@dataclass(frozen=True)
class VariableSpec:
    """One state variable of the member files.

    Attributes
    ----------
    name : str
        Variable name in every member file.
    mask : str or None
        Name of a variable (in the first member file, same dims as ``name`` or
        its trailing horizontal dims) whose non-zero entries select the grid
        points that enter the state vector, e.g. a land mask for soil moisture.
        With ``ensemble.grid`` it is read from the grid file, and may have
        any subset of the variable's interior dims in any order.
    dims : tuple of str or None
        Names of the variable's stored axes, in storage order, for files that
        do not name them (plain HDF5: phony dims); default ``ensemble.dims``.
    also : tuple of str
        Other variables of the same shape that receive the same increment,
        computed once (NEMO's ``tb`` for ``tn``).
    """

    name: str
    mask: str | None = None
    dims: tuple[str, ...] | None = None
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class Coordinates:
    """``ensemble.coordinates`` — names of the coordinate variables.

    ``lon``/``lat`` (degrees; 1-D rectilinear, 2-D curvilinear, or 1-D over
    one dimension for unstructured points) place the state rows and the
    observations; they are needed only by lon/lat observations and
    ``radius_km`` localization. ``level`` names the vertical coordinate
    (default: the netCDF coordinate variable of a 3-D variable's vertical
    dimension). ``time`` is only compared across members (when the first
    member has it). All of them must be equal in every member.
    """

    lon: str = "lon"
    lat: str = "lat"
    level: str | None = None
    time: str = "time"


@dataclass(frozen=True)
class TilesSpec:
    """``ensemble.tiles`` — a declared decomposition of tiled members (``{tile}``).

    Tile t holds block ``(t mod px, t div px)`` of a px × py block
    decomposition of the (lat, lon) grid (block sizes as the row
    distribution's, lon blocks fastest) plus ``halo`` points on each side
    (clipped at the grid's edge) that are read past and never written.
    Without this section a ``{tile}`` pattern takes its decomposition from
    NEMO's ``DOMAIN_*`` global attributes of the tile files.
    """

    count: int
    layout: tuple[int, int]
    halo: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"ensemble.tiles.count: must be at least 1, got {self.count}")
        px, py = self.layout
        if px < 1 or py < 1 or px * py != self.count:
            raise ConfigError(
                f"ensemble.tiles.layout: {list(self.layout)} is not [px, py] with "
                f"px * py = count {self.count}"
            )
        if self.halo < 0:
            raise ConfigError(f"ensemble.tiles.halo: must be >= 0, got {self.halo}")


@dataclass(frozen=True)
class EnsembleSection:
    """``ensemble:`` — where the member files are and what they hold.

    ``ids`` selects which member numbers form the ensemble (``size`` of
    them, in that order; default ``1..size``): the analysis of a cycle in
    which some members failed but ``workflow.min_members`` allowed it runs on
    the survivors (``ensio analyse --members 1,2,4``).

    ``slots`` is the pattern of each member's state at each time slot of a
    4-D analysis (``analysis.time_slots``), with ``{member}`` and ``{slot}``
    (1-based, slot 1 the earliest), e.g. the model's history files.

    ``dims``, ``halo``, ``cyclic``, ``time_level`` and ``grid`` describe model
    restarts that store more than the state (:mod:`.axes`): the rows are the
    interior elements at the state's time level, placed by the grid file.
    """

    members: str
    size: int
    variables: tuple[VariableSpec, ...]
    coordinates: Coordinates = field(default_factory=Coordinates)
    ids: tuple[int, ...] | None = None
    tiles: TilesSpec | None = None
    slots: str | None = None
    #: Names of the stored axes of every state variable, storage order (:mod:`.axes`).
    dims: tuple[str, ...] | None = None
    #: Ghost cells on each side of these dims: not in the state.
    halo: dict[str, int] = field(default_factory=dict)
    #: Dims whose halo is rewritten with copies of the opposite interior cells.
    cyclic: tuple[str, ...] = ()
    time_level: TimeLevel | None = None
    #: A netCDF file (relative to the config) holding coordinates and masks.
    grid: str | None = None

    def __post_init__(self) -> None:
        if self.slots is not None and not ("{member" in self.slots and "{slot" in self.slots):
            raise ConfigError(
                f"ensemble.slots: pattern {self.slots!r} needs {{member}} and {{slot}} placeholders"
            )
        if self.tiles is not None and not self.tiled:
            raise ConfigError(
                f"ensemble.tiles: pattern {self.members!r} of ensemble.members has no "
                "{tile} placeholder"
            )
        if self.size < 1:
            raise ConfigError(f"ensemble.size: must be at least 1, got {self.size}")
        if self.ids is not None:
            if len(self.ids) != self.size:
                raise ConfigError(
                    f"ensemble.ids: {len(self.ids)} member numbers for ensemble.size {self.size}"
                )
            bad = [i for i in self.ids if i < 1]
            if bad or len(set(self.ids)) != len(self.ids):
                raise ConfigError(
                    f"ensemble.ids: member numbers must be distinct and >= 1, got "
                    f"{list(self.ids)}"
                )
        if not self.variables:
            raise ConfigError("ensemble.variables: at least one state variable is required")
        names = [v.name for v in self.variables]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"ensemble.variables: {sorted(dup)[0]!r} listed twice")
        if "{member" not in self.members:
            raise ConfigError(
                f"ensemble.members: pattern {self.members!r} has no {{member}} placeholder"
            )
        self._check_axes(names)

    def _check_axes(self, names: list[str]) -> None:
        """The axis keys (:mod:`.axes`), ``also``, and what tiled members cannot do."""
        check_axes(self.dims, [(v.name, v.dims) for v in self.variables], self.halo,
                   self.cyclic, self.time_level)
        seen: dict[str, str] = {}
        for i, v in enumerate(self.variables):
            for a in v.also:
                if a in names:
                    raise ConfigError(
                        f"ensemble.variables[{i}].also: {a!r} is a state variable itself"
                    )
                if a in seen:
                    raise ConfigError(
                        f"ensemble.variables[{i}].also: {a!r} already receives the increment "
                        f"of {seen[a]!r}"
                    )
                seen[a] = v.name
        if self.tiled and self.selects_elements:
            raise ConfigError(
                f"ensemble.{self.selects_elements[0]}: not supported with tiled members "
                f"({{tile}} in ensemble.members {self.members!r})"
            )

    @property
    def selects_elements(self) -> list[str]:
        """The keys set that choose stored elements or rewrite others (halo, levels, ...)."""
        keys = [k for k in ("dims", "grid", "time_level") if getattr(self, k) is not None]
        keys += [k for k in ("halo", "cyclic") if getattr(self, k)]
        keys += [f"variables[{i}].{k}" for i, v in enumerate(self.variables)
                 for k in ("dims", "also") if getattr(v, k)]
        return keys

    @property
    def tiled(self) -> bool:
        """Each member is P tile files (the pattern has ``{tile}``)."""
        return "{tile" in self.members

    @property
    def numbers(self) -> tuple[int, ...]:
        """The member numbers of the ensemble, in matrix order."""
        return self.ids if self.ids is not None else tuple(range(1, self.size + 1))

    def member_path(self, member: int, base: Path) -> Path:
        """Path of ``member`` (1-based), relative patterns resolved against ``base``."""
        if self.tiled:
            raise ConfigError(
                f"ensemble.members: {self.members!r} names tiled members ({{tile}}), which "
                "only ensio analyse reads and writes so far"
            )
        p = Path(self.members.format(member=member))
        return p if p.is_absolute() else base / p

    def tile_path(self, member: int, tile: int, base: Path) -> Path:
        """Path of tile ``tile`` (0-based) of ``member`` (1-based)."""
        p = Path(self.members.format(member=member, tile=tile))
        return p if p.is_absolute() else base / p

    def member_paths(self, base: Path) -> list[Path]:
        return [self.member_path(m, base) for m in self.numbers]

    def slot_path(self, member: int, slot: int, base: Path) -> Path:
        """State of ``member`` (1-based) at time slot ``slot`` (1-based), from ``slots``."""
        if self.slots is None:
            raise ConfigError("ensemble.slots: not set (needed for more than one time slot)")
        p = Path(self.slots.format(member=member, slot=slot))
        return p if p.is_absolute() else base / p


#: Implementations of the ensemble I/O (``io.mode``); :data:`ensio.io.modes.ensemble.ENSEMBLE_IO`
#: maps each to its class. ``files``: N_io readers of the member files + scatter;
#: ``shuffle``: tiled members on node-local disks, one tile per rank, group all-to-all.
IOMode = Literal["files", "shuffle"]

#: The modes whose analysis reads and writes node-local copies of the members
#: (``io.local_dir``, placed by ``ensio stage in``): they need ``local_dir``, and a
#: backup copies (and a restore puts back) those copies, not the global files.
#: Here, not on the mode's class, because the node room (backup) and the config
#: sit below io/modes and may not ask it.
LOCAL_MODES: frozenset[str] = frozenset({"shuffle"})

#: The modes whose read/write plan carries the layout's element selection and its
#: write-back companions (``ensemble.halo``, ``time_level``, ``grid``, ``also``, ...);
#: the shuffle mode moves tiles of whole variables. A table here for the reason above.
SELECTING_MODES: frozenset[str] = frozenset({"files"})


@dataclass(frozen=True)
class IOSection:
    """``io:`` — the parallel ensemble I/O.

    ``tasks`` is N_io; ``None`` means ``min(N_mpi, N_e)``, resolved at run time
    because N_mpi is only known then. ``mode`` selects the implementation;
    ``shuffle`` reads each rank's tile from ``local_dir`` (placed there by
    ``ensio stage in``, :mod:`ensio.io.node.placemap`).
    """

    mode: IOMode = "files"
    tasks: int | None = None
    journal: bool = True
    fsync: bool = False
    in_place: bool = True
    #: Node-local directory of each rank's files (``{host}``, ``{rank}``; ``ensio stage``).
    local_dir: str | None = None
    #: Per-cycle backup of each rank's files after the analysis (``{cycle}``; io.node.backup).
    backup_dir: str | None = None

    def __post_init__(self) -> None:
        if self.tasks is not None and self.tasks < 1:
            raise ConfigError(f"io.tasks: must be at least 1, got {self.tasks}")
        if self.works_locally and not self.local_dir:
            raise ConfigError(f"io.local_dir: required when io.mode is {self.mode}")
        if self.backup_dir is not None and "{cycle" not in self.backup_dir:
            raise ConfigError(
                f"io.backup_dir: pattern {self.backup_dir!r} has no {{cycle}} placeholder"
            )

    @property
    def works_locally(self) -> bool:
        """True if the analysis reads and writes node-local copies (:data:`LOCAL_MODES`)."""
        return self.mode in LOCAL_MODES


@dataclass(frozen=True)
class Config:
    """A whole run; ``base_dir`` is the directory relative paths are resolved against."""

    ensemble: EnsembleSection
    io: IOSection = field(default_factory=IOSection)
    observations: tuple[ObservationFile, ...] = ()
    analysis: AnalysisSection | None = None
    output: OutputSection = field(default_factory=OutputSection)
    workflow: WorkflowSection | None = None
    base_dir: Path = field(default=Path("."), compare=False)

    def __post_init__(self) -> None:
        keys = self.ensemble.selects_elements
        if keys and self.io.mode not in SELECTING_MODES:
            raise ConfigError(
                f"ensemble.{keys[0]}: not supported with io.mode {self.io.mode} (use io.mode "
                f"{' or '.join(sorted(SELECTING_MODES))})"
            )
        if not self.io.in_place and self.output.members is None:
            raise ConfigError("output.members: required when io.in_place is false")
        an = self.analysis
        if an is not None and an.n_slots > 1 and self.ensemble.slots is None:
            raise ConfigError(
                f"ensemble.slots: required for analysis.time_slots ({an.n_slots} slots): the "
                "pattern of each member's state at each slot"
            )
        wf = self.workflow
        if wf is not None and wf.min_members is not None and wf.min_members > self.ensemble.size:
            raise ConfigError(
                f"workflow.min_members: {wf.min_members} exceeds ensemble.size "
                f"{self.ensemble.size}"
            )

    def member_paths(self) -> list[Path]:
        return self.ensemble.member_paths(self.base_dir)

    def resolve(self, path: str) -> Path:
        """A path from the config, relative to the config file's directory."""
        p = Path(path)
        return p if p.is_absolute() else self.base_dir / p

    def output_member_paths(self) -> list[Path]:
        """Where the analysis members go: the member files themselves, or ``output.members``."""
        if self.io.in_place:
            return self.member_paths()
        pattern = self.output.members
        assert pattern is not None
        return [self.resolve(pattern.format(member=m)) for m in self.ensemble.numbers]


SHORT_FORMS[VariableSpec] = "name"  # ``variables: [t]``
