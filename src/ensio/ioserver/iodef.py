"""XIOS ``iodef.xml`` as an ensio output definition: load it, or convert it to YAML.

A model that ran with XIOS keeps its ``iodef.xml``: ``ensio ioserver iodef.xml``
reads it directly, and ``ensio ioserver convert iodef.xml -o iodef.yaml`` writes
the equivalent YAML. Both go through one mapping (:mod:`.iodefmap`) onto the
plain ``ioserver:`` mapping a YAML user writes, resolved by the YAML loader
(:func:`~.configload.ioserver_from_dict`), so the resolved config, its checks
and its messages are the same whichever file the user gave. The XML layer
(:mod:`.iodefxml`) refuses DTDs and entities (``defusedxml``) and follows
``src`` includes.

Attributes whose omission is harmless under XIOS's semantics are ignored with a
warning (one line each, on standard error, printed by the first caller that
loads the file on a process); anything else ensio cannot honour is an error
naming the element path and the attribute.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ..config.load import apply_overrides
from .iodefmap import Mapped, map_simulation
from .iodefxml import looks_like_xml, read_xml

__all__ = ["is_iodef_xml", "read_iodef", "iodef_section", "iodef_yaml"]

_log = logging.getLogger("ensio.ioserver.iodef")


def is_iodef_xml(path: str | Path) -> bool:
    """Is ``path`` an XML file (``*.xml`` or content starting with ``<``)?"""
    return looks_like_xml(Path(path))


def read_iodef(path: str | Path) -> Mapped:
    """The ``ioserver:`` mapping of an iodef.xml (plain data, as YAML would give)."""
    return map_simulation(read_xml(path))


def iodef_section(path: str | Path, overrides: Iterable[str] = ()) -> dict:
    """The ``ioserver:`` mapping of an iodef.xml with ``overrides`` applied
    (``ioserver.key=value``, the same dotted keys as for a YAML file), for
    :func:`.configload.load_ioserver_config` to resolve like a YAML file's.
    Warnings go to the log (stderr)."""
    mapped = read_iodef(Path(path))
    for w in mapped.warnings:
        _warn(w)
    return apply_overrides({"ioserver": mapped.section}, overrides)["ioserver"]


def iodef_yaml(path: str | Path, yaml_path: str | Path | None = None) -> tuple[str, Mapped]:
    """The YAML text equivalent to an iodef.xml (and the mapping, with its warnings).

    ``output_dir`` is where the XML's files go (XIOS writes in its run directory,
    beside the iodef.xml): ``.`` or a subdirectory relative to ``yaml_path``'s
    directory, else the absolute path.
    """
    import yaml

    path = Path(path)
    mapped = read_iodef(path)
    section = dict(mapped.section)
    where = Path(yaml_path).resolve().parent if yaml_path is not None else path.resolve().parent
    rel = os.path.relpath(path.resolve().parent, where)
    section["output_dir"] = str(path.resolve().parent) if rel.startswith("..") else rel
    head = (f"# converted from {path.name} (context {mapped.context}) by "
            "ensio ioserver convert\n")
    body = yaml.safe_dump({"ioserver": section}, sort_keys=False, default_flow_style=None,
                          width=100, allow_unicode=True)
    return head + body, mapped


def _warn(message: str) -> None:
    """One line on stderr (the log's last-resort handler when logging is not set up);
    every server process that loads the file says it (one, usually)."""
    _log.warning("ensio: warning: %s", message)
