"""Fields and files of an iodef.xml context (the mixin of :class:`.iodefmap._Mapper`).

Definition fields keep their ``field_group`` structure (the YAML loader applies
the inheritance, as XIOS does). File entries are flat: a file's own field
groups are applied here, under the loader's precedence (an attribute the entry
or the field it references sets wins over the group's), because ensio's file
entries have no groups. Pseudo-keys starting with ``_`` (the domain/axis a
group passes down, a field's ``level``) never reach the YAML.
"""

from __future__ import annotations

import re
from typing import Any

from .iodefattrs import FIELD, FILE, apply, supported
from .iodefxml import Node, number

__all__ = ["FieldsMixin", "split_name_format"]

Out = dict[str, Any]
_SPECIAL = ("id", "field_ref", "grid_ref", "domain_ref", "axis_ref", "level", "expr",
            "group_ref")
_THIS = re.compile(r"\bthis\b")
_XIOS_DATE = (("%y", "%Y"), ("%mo", "%m"), ("%mi", "%M"), ("%d", "%d"), ("%h", "%H"),
              ("%s", "%S"))
_DEFAULT_FORMAT = {"y": "%y", "mo": "%y%mo", "d": "%y%mo%d", "h": "%y%mo%d%h",
                   "mi": "%y%mo%d%h%mi", "s": "%y%mo%d%h%mi%s", "ts": "%y%mo%d%h%mi%s"}
_VAR_TYPES = {"string": str, "char": str, "bool": None, "int": int, "int16": int,
              "int32": int, "int64": int, "float": float, "double": float, "real": float}


def split_name_format(split_freq: str, xios_format: str | None) -> str:
    """The strftime format of split file names from XIOS's ``split_freq_format``
    (``%y%mo%d``), by default as precise as the split frequency."""
    fmt = xios_format
    if not fmt:
        fmt = _DEFAULT_FORMAT[split_freq.lstrip("0123456789")]
    out, i = [], 0
    while i < len(fmt):
        for xios, c in _XIOS_DATE:
            if fmt.startswith(xios, i):
                out.append(c)
                i += len(xios)
                break
        else:
            ch = fmt[i]
            out.append("{{" if ch == "{" else "}}" if ch == "}" else ch)
            i += 1
    return "".join(out)


def _public(d: Out) -> Out:
    return {k: v for k, v in d.items() if not k.startswith("_")}


class FieldsMixin:
    """``field_definition`` and ``file_definition`` of one context."""

    warnings: list[str]
    grids: dict[str, Out]
    axes: dict[str, Out]
    domains: dict[str, Out]
    defs: dict[str, tuple[Out, tuple[Out, ...]]]
    group_fields: dict[str, list[str]]
    pending: dict[tuple[str, str], Node]
    uses: list[tuple[Node, str, str]]  # (element, field_ref, grid) of fields on another grid

    def grid_for(self, node: Node, domain: str, axis: str | None) -> str: ...

    # --- one field or group element ----------------------------------------------------

    def field_attrs(self, node: Node, chain: tuple[Out, ...], group: bool = False) -> Out:
        """The element's own attributes as ensio keys (plus ``_domain``/``_axis``/
        ``_level``); ``chain`` = the enclosing groups' (innermost first)."""
        out = apply(node, FIELD, {}, self.warnings, skip=_SPECIAL)
        a = node.attrib
        if group and "name" in out:
            raise node.fail("a field_group has no name (put it on the fields)", "name")
        ref = a.get("field_ref")
        if ref is not None:
            if group:
                raise node.fail("field_ref belongs on fields, not groups", "field_ref")
            out["field_ref"] = ref.strip()
        if "grid_ref" in a:
            if "domain_ref" in a or "axis_ref" in a:
                raise node.fail("give grid_ref or domain_ref/axis_ref, not both", "grid_ref")
            out["grid"] = a["grid_ref"].strip()
        elif "domain_ref" in a or "axis_ref" in a:
            self._grid_from_refs(node, chain, out)
        if "level" in a:
            out["_level"] = int(number(node, "level", int))
        expr = a.get("expr") or (node.text if not group else "")
        if expr:
            expr = " ".join(expr.split())
            if _THIS.search(expr):
                if ref is None:
                    raise node.fail("'this' in an expression needs a field_ref", "expr")
                expr = _THIS.sub(ref.strip(), expr)
            out["expr"] = expr
        return out

    def _grid_from_refs(self, node: Node, chain: tuple[Out, ...], out: Out) -> None:
        a = node.attrib
        dom = a.get("domain_ref")
        axis = a.get("axis_ref")
        for g in chain:
            if dom is None and "_domain" in g:
                dom = g["_domain"]
            if dom is None and "grid" in g and g["grid"] in self.grids:
                dom = self.grids[g["grid"]]["domain"]
                if axis is None and "axis_ref" not in a:
                    axis = self.grids[g["grid"]].get("axis")
            if axis is None and "_axis" in g and "axis_ref" not in a:
                axis = g["_axis"]
        if dom is None:
            raise node.fail("an axis_ref needs a domain (ensio has no axis-only grids)",
                            "axis_ref")
        out["grid"] = self.grid_for(node, dom.strip(), axis.strip() if axis else None)
        out["_domain"] = dom.strip()
        if axis:
            out["_axis"] = axis.strip()

    # --- definitions ------------------------------------------------------------------

    def field_definition(self, node: Node) -> list[Out]:
        """The definition as YAML field groups (attributes on field_definition make one
        group around everything)."""
        root = self.field_attrs(node, (), group=True)
        chain = (root,) if root else ()
        items = [self.def_node(c, chain, []) for c in node.children]
        if not root:
            return items
        wrapper: Out = {"id": "field_definition", **_public(root)}
        fs = [i for i in items if "fields" not in i and "groups" not in i]
        gs = [i for i in items if "fields" in i or "groups" in i]
        if fs:
            wrapper["fields"] = fs
        if gs:
            wrapper["groups"] = gs
        return [wrapper]

    def def_node(self, c: Node, chain: tuple[Out, ...], owners: list[str]) -> Out:
        """A definition element as YAML; ``owners`` = the ids of the groups it is in
        (for ``group_ref`` in files)."""
        if c.tag == "field":
            fid = c.attrib.get("id")
            if not fid:
                raise c.fail("a field in field_definition needs an id", "id")
            fid = fid.strip()
            own = self.field_attrs(c, chain)
            for ch in c.children:
                self._field_child(ch)
            if fid in self.defs:
                raise c.fail(f"duplicate field id {fid!r}", "id")
            self.defs[fid] = (own, chain)
            for g in owners:
                self.group_fields[g].append(fid)
            self._note_use(c, own)
            return {"id": fid, **_public(own)}
        if c.tag == "field_group":
            if "group_ref" in c.attrib:
                raise c.fail("group_ref in field_definition is not supported (use it in a "
                             "file)", "group_ref")
            gid = c.attrib.get("id")
            attrs = self.field_attrs(c, chain, group=True)
            mine = list(owners)
            if gid:
                self.group_fields.setdefault(gid.strip(), [])
                mine.append(gid.strip())
            inner = [self.def_node(x, (attrs, *chain), mine) for x in c.children]
            out: Out = ({"id": gid.strip()} if gid else {}) | _public(attrs)
            fs = [i for i in inner if "fields" not in i and "groups" not in i]
            gs = [i for i in inner if "fields" in i or "groups" in i]
            if fs:
                out["fields"] = fs
            if gs:
                out["groups"] = gs
            if not fs and not gs:
                out["fields"] = []
            return out
        raise c.fail("<field_definition> holds <field> and <field_group> elements only")

    def _field_child(self, ch: Node) -> None:
        if ch.tag in ("variable", "variable_group"):
            self.warnings.append(f"{ch.file}: {ch.where}: ignored (ensio writes no "
                                 "per-variable attributes)")
            return
        raise ch.fail(f"<{ch.tag}> inside a field is not supported")

    def given(self, fid: str, stack: tuple[str, ...] = ()) -> Out:
        """Attributes a field got from its groups, its reference and itself (what a
        referencing entry inherits; the defaults are not in it)."""
        if fid not in self.defs or fid in stack:
            return {}
        own, chain = self.defs[fid]
        merged: Out = {}
        for g in reversed(chain):
            merged.update(g)
        ref = own.get("field_ref")
        if ref is not None:
            merged.update(self.given(ref, (*stack, fid)))
        merged.update(own)
        for k in ("field_ref", "expr", "id"):
            merged.pop(k, None)
        return merged

    # --- files ------------------------------------------------------------------------

    def file_definition(self, node: Node, count: int) -> list[Out]:
        out: list[Out] = []
        defaults = apply(node, FILE, {}, self.warnings)
        self._files(node, defaults, dict(node.attrib), out, count)
        return out

    def _files(self, node: Node, inherited: Out, raw: dict[str, str], out: list[Out],
               count: int) -> None:
        for c in node.children:
            if c.tag == "file_group":
                grp = apply(c, FILE, dict(inherited), self.warnings, skip=("id",))
                self._files(c, grp, {**raw, **{k: v for k, v in c.attrib.items()
                                               if k != "id"}}, out, count)
            elif c.tag == "file":
                out.append(self.file_node(c, inherited, raw, count + len(out)))
            else:
                raise c.fail("<file_definition> holds <file> and <file_group> elements only")

    def file_node(self, c: Node, inherited: Out, raw_inh: dict[str, str], n: int) -> Out:
        mapped = apply(c, FILE, dict(inherited), self.warnings, skip=("id",))
        raw = {**raw_inh, **c.attrib}
        fid = (c.attrib.get("id") or f"file{n + 1}").strip()
        name = (raw.get("name") or fid).strip() + raw.get("name_suffix", "").strip()
        if "@" in name:
            raise c.fail(f"{name!r}: @...@ placeholders are filled by the model at run time "
                         "in NEMO; write the name", "name")
        name = name.replace("{", "{{").replace("}", "}}")
        if mapped.get("split_freq"):
            fmt = split_name_format(mapped["split_freq"], raw.get("split_freq_format"))
            name += f"_{{start:{fmt}}}-{{end:{fmt}}}"
        level = None
        if "output_level" in raw:
            level = int(number(Node("file", raw, "", where=c.where, file=c.file),
                               "output_level", int))
        out: Out = {"id": fid, "name": name, **mapped}
        if supported("file", "time_naming"):
            out["time_naming"] = "xios"
        attributes: Out = {k: raw[k].strip() for k in ("description", "comment") if k in raw}
        entries: list[Out] = []
        for ch in c.children:
            self._file_child(ch, (), level, entries, attributes)
        if attributes:
            out["attributes"] = attributes
        out["fields"] = entries
        return out

    def _file_child(self, ch: Node, chain: tuple[Out, ...], level: int | None,
                    entries: list[Out], attributes: Out) -> None:
        if ch.tag == "field":
            entries.append(self.file_entry(ch, self.field_attrs(ch, chain), chain, level))
        elif ch.tag == "field_group":
            attrs = self.field_attrs(ch, chain, group=True)
            ref = ch.attrib.get("group_ref")
            if ref is not None:
                ref = ref.strip()
                if ref not in self.group_fields:
                    raise ch.fail(f"no field_group {ref!r} in field_definition", "group_ref")
                for fid in self.group_fields[ref]:
                    entries.append(self.file_entry(ch, {"field_ref": fid}, (attrs, *chain),
                                                   level))
            for x in ch.children:
                self._file_child(x, (attrs, *chain), level, entries, attributes)
        elif ch.tag == "variable_group":
            for x in ch.children:
                self._file_child(x, chain, level, entries, attributes)
        elif ch.tag == "variable":
            key = (ch.attrib.get("name") or ch.attrib.get("id") or "").strip()
            if not key:
                raise ch.fail("a variable needs an id or name", "id")
            attributes[key] = self.variables(ch)
        else:
            raise ch.fail("a <file> holds <field>, <field_group> and <variable> elements")

    def variables(self, ch: Node) -> Any:
        kind = ch.attrib.get("type", "string").strip().lower()
        if kind not in _VAR_TYPES:
            raise ch.fail(f"{kind!r}: ensio reads string, int, float, double, bool", "type")
        if kind == "bool":
            return ch.text.strip().lower().strip(".") in ("true", "t")
        conv = _VAR_TYPES[kind]
        try:
            return conv(ch.text.strip())
        except ValueError:
            raise ch.fail(f"{ch.text!r} is not a {kind}") from None

    def file_entry(self, ch: Node, own: Out, chain: tuple[Out, ...], level: int | None) -> Out:
        own = dict(own)
        fid = ch.attrib.get("id") if ch.tag == "field" else None
        if fid and "name" not in own:
            own["name"] = fid.strip()
        ref = own.get("field_ref")
        if ref is None and "expr" not in own:
            raise ch.fail("a file's field needs a field_ref or an expression", "field_ref")
        base = self.given(ref) if ref is not None else {}
        for g in chain:
            for k, v in g.items():
                if k not in own and k not in base:
                    own[k] = v
        lev = own.get("_level", base.get("_level"))
        if level is not None and lev is not None and lev > level:
            own["enabled"] = False
        self._note_use(ch, own)
        return _public(own)

    # --- interpolation sources ----------------------------------------------------------

    def _note_use(self, node: Node, own: Out) -> None:
        if own.get("field_ref") is not None and "grid" in own:
            self.uses.append((node, own["field_ref"], own["grid"]))

    def resolve_pending(self) -> None:
        """Give each interpolated domain/axis the domain/axis of the fields mapped to it."""
        for (kind, ident), node in self.pending.items():
            sources = set()
            for _, ref, grid in self.uses:
                g = self.grids.get(grid)
                if g is None or g.get(kind) != ident:
                    continue
                src_grid = self.given(ref).get("grid")
                src = self.grids.get(src_grid, {}).get(kind) if src_grid else None
                if src is not None and src != ident:
                    sources.add(src)
            if not sources:
                raise node.fail(f"no field is interpolated to {kind} {ident!r} (XIOS takes "
                                "the source from a field_ref on another grid)")
            if len(sources) > 1:
                raise node.fail(f"fields from several {kind}s ({', '.join(sorted(sources))}) "
                                f"are interpolated to {ident!r}; ensio needs one source")
            table = self.domains if kind == "domain" else self.axes
            table[ident]["interpolate"]["from"] = sources.pop()
