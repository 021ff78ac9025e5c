"""An XIOS context mapped onto the YAML ``ioserver:`` section (plain data).

The reader does not build :class:`~.config.IOServerConfig` itself: it writes the
same plain mapping a user would write in YAML and hands it to
:func:`~.configload.ioserver_from_dict`, so every check and every message of
the YAML loader applies to an ``iodef.xml`` too, and ``ensio ioserver convert``
is this mapping dumped as YAML. What XIOS spells differently is undone here:

- group elements (``axis_group``, ``domain_group``, ``grid_group``,
  ``file_group``, ``field_group``) and the ``*_definition`` elements pass their
  attributes down; ``field_group`` stays a YAML field group, the others are
  flattened (ensio's YAML has no such groups);
- ``domain_ref``/``axis_ref`` on a field give it the grid of that domain (and
  axis), created as ``<domain>`` or ``<domain>__<axis>`` when no grid has them;
- a ``<field_group group_ref="g"/>`` in a file is one file entry per field of g;
  attributes of a file's field groups apply where neither the entry nor the
  field it references set them (the loader's precedence: own, reference, groups);
- ``level`` above the file's ``output_level`` disables the entry;
- ``@x`` expressions are the element text (or ``expr``), ``this`` being the
  field reference;
- ``interpolate_domain``/``interpolate_axis`` take their source from the fields
  that use them (XIOS never names it).

Attributes are looked up in :mod:`.iodefattrs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .iodefattrs import AXIS, CALENDAR, DOMAIN, apply, supported
from .iodeffields import FieldsMixin
from .iodefxml import Node, boolean, calendar_type

__all__ = ["Mapped", "map_simulation"]

Out = dict[str, Any]



@dataclass
class Mapped:
    """The ``ioserver:`` mapping of one context, and the warnings of the mapping."""

    section: Out
    context: str
    warnings: list[str] = field(default_factory=list)


def map_simulation(root: Node) -> Mapped:
    """Map the model context of a ``<simulation>`` (XIOS's own ``xios`` context gives
    only ``using_server``)."""
    if root.tag not in ("simulation", "xios"):
        raise root.fail("the root element of an iodef.xml is <simulation>")
    contexts = []
    for c in root.children:
        if c.tag != "context":
            raise c.fail("a <simulation> holds <context> elements only")
        contexts.append(c)
    model = [c for c in contexts if c.attrib.get("id") != "xios"]
    if not model:
        raise root.fail("no model <context> (only XIOS's own context xios)")
    if len(model) > 1:
        ids = ", ".join(c.attrib.get("id", "?") for c in model)
        raise root.fail(f"{len(model)} model contexts ({ids}): ensio serves one context "
                        "per iodef; keep one")
    m = _Mapper()
    section = m.context(model[0])
    for c in contexts:
        if c.attrib.get("id") == "xios":
            mode = m.xios_context(c)
            if mode is not None:
                section = {"mode": mode, **section}
    return Mapped(section, model[0].attrib.get("id", "model"), m.warnings)


def _flatten(node: Node, leaf: str, group: str, table: dict, warnings: list[str],
             inherited: Out | None = None) -> Iterator[tuple[Node, Out]]:
    """The ``leaf`` elements under ``node`` with their groups' attributes (outer first)."""
    base = dict(inherited or {})
    for c in node.children:
        if c.tag == group:
            grp = apply(c, table, dict(base), warnings, skip=("id",))
            yield from _flatten(c, leaf, group, table, warnings, grp)
        elif c.tag == leaf:
            yield c, base
        else:
            raise c.fail(f"<{node.tag}> holds <{leaf}> and <{group}> elements only")


def _ident(node: Node, what: str) -> str:
    ident = node.attrib.get("id")
    if not ident:
        raise node.fail(f"a {what} needs an id", "id")
    return ident.strip()


class _Mapper(FieldsMixin):
    """Walks one context; holds what later elements refer to (fields and files: the
    mixin of :mod:`.iodeffields`)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.axes: dict[str, Out] = {}
        self.domains: dict[str, Out] = {}
        self.grids: dict[str, Out] = {}
        self.defs: dict[str, tuple[Out, tuple[Out, ...]]] = {}
        self.group_fields: dict[str, list[str]] = {}
        # transformed domains/axes whose source the fields tell: id -> (kind, node)
        self.pending: dict[tuple[str, str], Node] = {}
        self.uses: list[tuple[Node, str, str]] = []

    # --- context, calendar, XIOS's own context --------------------------------------

    def context(self, ctx: Node) -> Out:
        order = ("calendar", "axis_definition", "domain_definition", "grid_definition",
                 "field_definition", "file_definition")
        ignore = ("variable_definition", "scalar_definition")
        for c in ctx.children:
            if c.tag not in order + ignore:
                raise c.fail(f"<{c.tag}> is not an element of a context ensio reads")
            if c.tag == "scalar_definition" and c.children:
                self.warnings.append(f"{c.file}: {c.where}: ignored (ensio has no scalars; "
                                     "a grid or field using one is an error)")
            if c.tag == "variable_definition" and c.children:
                self.warnings.append(f"{c.file}: {c.where}: ignored (the model reads "
                                     "these with xios_getvar, which ensio does not provide)")
        for a in ctx.attrib:
            if a != "id":
                raise ctx.fail("not an attribute ensio reads on <context>", a)
        cals = [c for c in ctx.children if c.tag == "calendar"]
        if not cals:
            raise ctx.fail("no <calendar>: ensio's servers plan the output before the "
                           "model runs, so the calendar (type, start_date, timestep) must "
                           "be in the iodef.xml; the model's xios_define_calendar must agree")
        section: Out = {"output_dir": ".", "calendar": self.calendar(cals[-1])}
        for tag, fn in (("axis_definition", self.axis_definition),
                        ("domain_definition", self.domain_definition),
                        ("grid_definition", self.grid_definition)):
            for c in ctx.children:
                if c.tag == tag:
                    fn(c)
        groups: list[Out] = []
        for c in ctx.children:
            if c.tag == "field_definition":
                groups.extend(self.field_definition(c))
        files: list[Out] = []
        for c in ctx.children:
            if c.tag == "file_definition":
                files.extend(self.file_definition(c, len(files)))
        self.resolve_pending()
        section["axes"] = list(self.axes.values())
        section["domains"] = list(self.domains.values())
        section["grids"] = list(self.grids.values())
        section["field_groups"] = [g for g in groups if "fields" in g or "groups" in g]
        loose = [g for g in groups if "fields" not in g and "groups" not in g]
        if loose:
            section["fields"] = loose
        section["files"] = files
        return section

    def calendar(self, node: Node) -> Out:
        out = apply(node, CALENDAR, {}, self.warnings, skip=("type", "time_origin"))
        if "type" not in node.attrib:
            raise node.fail("the calendar type is required (Gregorian, NoLeap, D360...)",
                            "type")
        out = {"type": calendar_type(node), **out}
        if "timestep" not in out:
            raise node.fail("timestep is required: ensio's servers plan from it before the "
                            "model runs", "timestep")
        origin = node.attrib.get("time_origin")
        if origin is not None and origin.strip() != out.get("start", "").strip():
            self.warnings.append(
                f"{node.file}: {node.where} attribute time_origin: ignored (times are "
                "counted from start_date; the units attribute says so, the dates are the same)")
        return out

    def xios_context(self, ctx: Node) -> str | None:
        mode = None
        for c in _walk(ctx):
            if c.tag == "variable" and c.attrib.get("id") == "using_server":
                using = c.text.strip().lower().strip(".") in ("true", "t")
                mode = "server" if using else "attached"
        return mode

    # --- axes, domains, grids -------------------------------------------------------

    def axis_definition(self, node: Node) -> None:
        for leaf, inherited in _flatten(node, "axis", "axis_group", AXIS, self.warnings,
                                        apply(node, AXIS, {}, self.warnings)):
            self.define_axis(leaf, inherited, _ident(leaf, "axis"))

    def define_axis(self, leaf: Node, inherited: Out, ident: str) -> str:
        out = dict(inherited)
        ref = leaf.attrib.get("axis_ref")
        if ref is not None:
            if ref not in self.axes:
                raise leaf.fail(f"no axis {ref!r} (defined before this one)", "axis_ref")
            out.update({k: v for k, v in self.axes[ref].items() if k != "id"})
        out.update(apply(leaf, AXIS, {}, self.warnings, skip=("id", "axis_ref")))
        out = {"id": ident, **{k: v for k, v in out.items() if k != "id"}}
        for c in leaf.children:
            self.axis_transform(c, ident, out)
        if "n" not in out:
            if "values" in out:
                out["n"] = len(out["values"])
            else:
                raise leaf.fail("n_glo is required: ensio's servers size the files before "
                                "the model runs", "n_glo")
        self.axes[ident] = out
        return ident

    def axis_transform(self, c: Node, ident: str, out: Out) -> None:
        if c.tag != "interpolate_axis":
            raise c.fail(f"<{c.tag}> is not supported (ensio's axis transformation is "
                         "interpolate_axis)")
        if not supported("axis", "interpolate"):
            raise c.fail("not supported yet (needs the axis key interpolate)")
        for a, v in c.attrib.items():
            if a == "order" and v.strip() != "1":
                raise c.fail(f"{v!r}: ensio interpolates linearly (order 1)", a)
            if a == "type" and v.strip() != "polynomial":
                raise c.fail(f"{v!r}: ensio's vertical interpolation is polynomial order 1",
                             a)
            if a == "coordinate":
                raise c.fail("interpolation along a coordinate field is not supported", a)
            if a not in ("order", "type", "id"):
                raise c.fail("not an attribute ensio reads on <interpolate_axis>", a)
        out["interpolate"] = {"from": None}
        self.pending[("axis", ident)] = c

    def domain_definition(self, node: Node) -> None:
        for leaf, inherited in _flatten(node, "domain", "domain_group", DOMAIN,
                                        self.warnings, apply(node, DOMAIN, {}, self.warnings)):
            self.define_domain(leaf, inherited, _ident(leaf, "domain"))

    def define_domain(self, leaf: Node, inherited: Out, ident: str) -> str:
        out = dict(inherited)
        ref = leaf.attrib.get("domain_ref")
        if ref is not None:
            if ref not in self.domains:
                raise leaf.fail(f"no domain {ref!r} (defined before this one)", "domain_ref")
            out.update({k: v for k, v in self.domains[ref].items() if k != "id"})
        out.update(apply(leaf, DOMAIN, {}, self.warnings, skip=("id", "domain_ref")))
        if out.get("type") == "gaussian":
            raise leaf.fail("gaussian domains are not supported", "type")
        for a in ("type", "ni_glo"):
            if a not in out:
                raise leaf.fail(f"{a} is required: ensio's servers size the files before "
                                "the model runs", a)
        out = {"id": ident, **{k: v for k, v in out.items() if k != "id"}}
        for c in leaf.children:
            self.domain_transform(c, ident, out)
        self.domains[ident] = out
        return ident

    def domain_transform(self, c: Node, ident: str, out: Out) -> None:
        if c.tag != "interpolate_domain":
            raise c.fail(f"<{c.tag}> is not supported (ensio's domain transformation is "
                         "interpolate_domain)")
        if not supported("domain", "interpolate"):
            raise c.fail("not supported yet (needs the domain key interpolate)")
        renorm = False
        for a, v in c.attrib.items():
            if a == "order" and v.strip() != "1":
                raise c.fail(f"{v!r}: ensio's conservative remapping is first order", a)
            elif a == "renormalize":
                renorm = boolean(c, a)
            elif a == "mode" and v.strip() != "compute":
                raise c.fail(f"{v!r}: weights are always computed (mode compute)", a)
            elif a in ("write_weight", "quantity") and boolean(c, a):
                raise c.fail("not supported", a)
            elif a not in ("order", "renormalize", "mode", "write_weight", "quantity", "id",
                           "detect_missing_value", "use_area", "read_write_convention"):
                raise c.fail("not an attribute ensio reads on <interpolate_domain>", a)
        out["interpolate"] = {"from": None, "method": "conservative", "renormalize": renorm}
        self.pending[("domain", ident)] = c

    def grid_definition(self, node: Node) -> None:
        for leaf, _ in _flatten(node, "grid", "grid_group", {}, self.warnings):
            self.define_grid(leaf)

    def define_grid(self, leaf: Node) -> None:
        gid = _ident(leaf, "grid")
        for a in leaf.attrib:
            if a not in ("id", "name", "description"):
                raise leaf.fail("not an attribute ensio reads on <grid>", a)
        dom = axis = None
        for c in leaf.children:
            if c.tag == "domain" and dom is None and axis is None:
                dom = self.grid_member(c, gid, "domain")
            elif c.tag == "axis" and dom is not None and axis is None:
                axis = self.grid_member(c, gid, "axis")
            else:
                raise c.fail("an ensio grid is one <domain> and at most one <axis> after "
                             "it (no scalars)")
        if dom is None:
            raise leaf.fail("a grid needs a <domain>")
        if gid in self.grids:
            raise leaf.fail(f"duplicate grid id {gid!r}", "id")
        self.grids[gid] = {"id": gid, "domain": dom, **({"axis": axis} if axis else {})}

    def grid_member(self, c: Node, gid: str, kind: str) -> str:
        ref = c.attrib.get(f"{kind}_ref")
        known = self.domains if kind == "domain" else self.axes
        if ref is None:
            raise c.fail(f"a grid's <{kind}> names a defined {kind}", f"{kind}_ref")
        if ref not in known:
            raise c.fail(f"no {kind} {ref!r}", f"{kind}_ref")
        if not c.children and set(c.attrib) <= {f"{kind}_ref"}:
            return ref
        ident = c.attrib.get("id") or f"{ref}_{gid}"
        fn = self.define_domain if kind == "domain" else self.define_axis
        return fn(c, {}, ident)

    def grid_for(self, node: Node, domain: str, axis: str | None) -> str:
        """The grid of ``domain`` (and ``axis``), created if no grid has exactly them."""
        if domain not in self.domains:
            raise node.fail(f"no domain {domain!r}", "domain_ref")
        if axis is not None and axis not in self.axes:
            raise node.fail(f"no axis {axis!r}", "axis_ref")
        for g in self.grids.values():
            if g["domain"] == domain and g.get("axis") == axis:
                return g["id"]
        gid = domain if axis is None else f"{domain}__{axis}"
        while gid in self.grids:
            gid += "_"
        self.grids[gid] = {"id": gid, "domain": domain, **({"axis": axis} if axis else {})}
        return gid


def _walk(node: Node) -> Iterator[Node]:
    for c in node.children:
        yield c
        yield from _walk(c)
