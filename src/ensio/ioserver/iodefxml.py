"""Reading an XIOS ``iodef.xml`` safely: elements, ``src`` includes, XIOS value syntax.

An ``iodef.xml`` is input from outside (a run directory, a colleague, a web page),
so it is parsed with :mod:`defusedxml`: a document type definition, entity
expansion ("billion laughs") and external entities are refused with a one-line
error instead of eating the memory of every server rank. XIOS files include
others with ``src="file.xml"`` on any element (NEMO's ``<context id="nemo"
src="./context_nemo.xml"/>``, ``<field_definition src="./field_def.xml"/>``);
the included file's root must be the same element, and its attributes and
children are merged in (the including element's own attributes win). Includes
are paths relative to the including file, nested at most :data:`MAX_DEPTH`
deep and never in a cycle.

The value parsers (durations ``1d12h``, booleans ``.TRUE.``, arrays
``(0,2)[1 2 3]``, XIOS calendar names) live here too: they are the XIOS
syntax, kept apart from the mapping onto ensio's keys (:mod:`.iodefmap`).
Every error is a :class:`~ensio.config.errors.ConfigError` naming the file and
the element path (``context[nemo]/file_definition/file[f1]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree.ElementTree import Element, ParseError

from ..config.errors import ConfigError

__all__ = [
    "Node",
    "MAX_DEPTH",
    "read_xml",
    "looks_like_xml",
    "duration",
    "boolean",
    "number",
    "array",
    "calendar_type",
]

#: deepest chain of ``src`` includes (NEMO uses two levels)
MAX_DEPTH = 8


@dataclass
class Node:
    """One element: its tag, attributes, stripped text and children, and where it is."""

    tag: str
    attrib: dict[str, str]
    text: str
    children: list[Node] = field(default_factory=list)
    where: str = ""      # element path for messages
    file: Path = Path()  # the file it was read from

    def fail(self, message: str, attr: str | None = None) -> ConfigError:
        """A one-line error naming the file, the element path and the attribute."""
        at = f" attribute {attr}" if attr else ""
        return ConfigError(f"{self.file}: {self.where}{at}: {message}")

    def child_path(self, tag: str, attrib: dict[str, str]) -> str:
        label = attrib.get("id") or attrib.get("field_ref") or attrib.get("domain_ref") \
            or attrib.get("axis_ref") or attrib.get("scalar_ref") or attrib.get("group_ref") \
            or attrib.get("name")
        me = f"{tag}[{label}]" if label else tag
        return f"{self.where}/{me}" if self.where else me


def looks_like_xml(path: Path) -> bool:
    """``*.xml``, or a file whose first non-blank character opens an element."""
    if path.suffix.lower() == ".xml":
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(512).lstrip()
    except OSError:
        return False
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:].lstrip()
    return head.startswith(b"<")


def _parse(path: Path) -> Element:
    import defusedxml.ElementTree as safe_et
    from defusedxml import DefusedXmlException

    try:
        return safe_et.parse(str(path), forbid_dtd=True).getroot()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read iodef ({exc.strerror or exc})") from None
    except ParseError as exc:
        raise ConfigError(f"{path}: not well-formed XML ({exc})") from None
    except DefusedXmlException as exc:
        raise ConfigError(f"{path}: refused: {type(exc).__name__} (an iodef.xml needs no "
                          "DTD or entities)") from None


def read_xml(path: str | Path) -> Node:
    """The root element of ``path`` with every ``src`` include merged in."""
    path = Path(path)
    root = _parse(path)
    return _convert(root, path, "", (path.resolve(),))


def _convert(el: Element, file: Path, parent_where: str, stack: tuple[Path, ...]) -> Node:
    tag = el.tag if isinstance(el.tag, str) else ""
    attrib = dict(el.attrib)
    probe = Node(tag, attrib, "", where=parent_where, file=file)
    where = probe.child_path(tag, attrib)
    node = Node(tag, attrib, (el.text or "").strip(), [], where, file)
    src = attrib.pop("src", None)
    if src is not None:
        inc = _include(node, src, stack)
        node.attrib = {**inc.attrib, **attrib}
        node.text = node.text or inc.text
        node.children = inc.children
    node.children += [_convert(c, file, where, stack) for c in el
                      if isinstance(c.tag, str)]
    return node


def _include(node: Node, src: str, stack: tuple[Path, ...]) -> Node:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", src):
        raise node.fail(f"{src!r} is a URL; give a file path", "src")
    target = (node.file.parent / src).resolve()
    if target in stack:
        raise node.fail(f"{src!r} includes itself (cycle through {target.name})", "src")
    if len(stack) >= MAX_DEPTH:
        raise node.fail(f"includes nested deeper than {MAX_DEPTH}", "src")
    root = _parse(target)
    if root.tag != node.tag:
        raise node.fail(f"{src!r} holds <{root.tag}>, not <{node.tag}>", "src")
    return _convert(root, target, node.where.rsplit("/", 1)[0] if "/" in node.where else "",
                    (*stack, target))


# --- XIOS value syntax -----------------------------------------------------------------

_DUR_TOKEN = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(mo|mi|ts|y|d|h|s)")
_FIXED = {"d": 86400, "h": 3600, "mi": 60, "s": 1}


def duration(node: Node, attr: str, *, zero_ok: bool = False) -> str | None:
    """An XIOS duration (``6h``, ``1d12h``, ``1.5h``, ``1mo``, ``1ts``) as an ensio
    frequency (``6h``, ``36h``, ``90mi``, ``1mo``, ``1ts``); ``None`` for a zero
    duration when ``zero_ok``."""
    text = node.attrib[attr].strip()
    parts, pos = [], 0
    while pos < len(text):
        m = _DUR_TOKEN.match(text, pos)
        if m is None:
            raise node.fail(f"{text!r} is not an XIOS duration (e.g. 6h, 1d12h, 1mo, 1ts)",
                            attr)
        parts.append((float(m.group(1)), m.group(2)))
        pos = m.end()
        while pos < len(text) and text[pos] in " +":
            pos += 1
    if not parts:
        raise node.fail("empty duration", attr)
    nonzero = [(v, u) for v, u in parts if v != 0]
    if not nonzero:
        if zero_ok:
            return None
        raise node.fail(f"{text!r}: a zero duration", attr)
    if len(nonzero) == 1 and nonzero[0][0].is_integer():
        v, u = nonzero[0]
        return f"{int(v)}{u}"
    if any(u not in _FIXED for _, u in nonzero):
        raise node.fail(f"{text!r}: ensio cannot mix or split months, years or time "
                        "steps (write one unit, e.g. 1mo)", attr)
    seconds = sum(v * _FIXED[u] for v, u in nonzero)
    if not float(seconds).is_integer():
        raise node.fail(f"{text!r} is not a whole number of seconds", attr)
    seconds = int(seconds)
    for unit in ("d", "h", "mi", "s"):
        if seconds % _FIXED[unit] == 0:
            return f"{seconds // _FIXED[unit]}{unit}"
    raise AssertionError("unreachable: every integer is whole seconds")


def boolean(node: Node, attr: str) -> bool:
    """XIOS booleans: ``.TRUE.``/``.FALSE.`` (any case), ``true``/``false``."""
    v = node.attrib[attr].strip().lower().strip(".")
    if v in ("true", "t"):
        return True
    if v in ("false", "f"):
        return False
    raise node.fail(f"{node.attrib[attr]!r} is not a boolean (.TRUE. or .FALSE.)", attr)


def number(node: Node, attr: str, kind: type = int) -> int | float:
    text = node.attrib[attr].strip()
    try:
        return kind(float(text)) if kind is float else int(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise node.fail(f"{text!r} is not {what}", attr) from None


_ARRAY = re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*\[(.*)\]$", re.S)


def array(node: Node, attr: str) -> list[float]:
    """XIOS 1-D arrays: ``(0,2)[1 2 3]`` (first and last index, then the values)."""
    text = node.attrib[attr].strip()
    m = _ARRAY.match(text)
    if m is None:
        raise node.fail(f"{text!r} is not an XIOS array such as (0,2)[1 2 3]", attr)
    lo, hi = int(m.group(1)), int(m.group(2))
    try:
        values = [float(v) for v in m.group(3).replace(",", " ").split()]
    except ValueError:
        raise node.fail(f"{text!r}: the values are not numbers", attr) from None
    if len(values) != hi - lo + 1:
        raise node.fail(f"{text!r}: ({lo},{hi}) announces {hi - lo + 1} values, "
                        f"{len(values)} given", attr)
    return values


_CALENDARS = {
    "gregorian": "gregorian", "standard": "standard",
    "proleptic_gregorian": "proleptic_gregorian", "julian": "julian",
    "noleap": "noleap", "365_day": "365_day", "allleap": "all_leap", "all_leap": "all_leap",
    "366_day": "366_day", "d360": "360_day", "360_day": "360_day",
}


def calendar_type(node: Node, attr: str = "type") -> str:
    """XIOS calendar names (``Gregorian``, ``Julian``, ``NoLeap``, ``AllLeap``, ``D360``)
    and CF names, as ensio's calendar types."""
    v = node.attrib[attr].strip()
    out = _CALENDARS.get(v.lower())
    if out is None:
        raise node.fail(f"{v!r}: ensio has Gregorian, Julian, NoLeap, AllLeap, D360 "
                        "(user_defined calendars are not supported)", attr)
    return out
