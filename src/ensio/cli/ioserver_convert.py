"""``ensio ioserver convert iodef.xml [-o iodef.yaml]``: an XIOS iodef.xml as ensio YAML.

The YAML is what :mod:`ensio.ioserver.iodef` maps the XML onto, so loading it
gives the same resolved config as loading the XML. The XML is resolved before
anything is written (a config error leaves no file), and the YAML replaces the
target atomically. Without ``-o`` the YAML goes to standard output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["run_convert"]


def run_convert(args: argparse.Namespace) -> int:
    from ..durable import atomic_write
    from ..errors import ConfigError
    from ..ioserver.configload import ioserver_from_dict
    from ..ioserver.iodef import iodef_yaml, is_iodef_xml

    if args.source is None:
        raise ConfigError("ensio ioserver convert: give the iodef.xml to convert")
    src = Path(args.source)
    if not src.is_file():
        raise ConfigError(f"{src}: no such file")
    if not is_iodef_xml(src):
        raise ConfigError(f"{src}: not an XML file (convert reads an XIOS iodef.xml)")
    out = Path(args.output) if args.output is not None else None
    text, mapped = iodef_yaml(src, out)
    # resolved before writing: every error of the loader, and nothing written on one
    ioserver_from_dict(mapped.section, base_dir=src.resolve().parent)
    for w in mapped.warnings:
        print(f"ensio: warning: {w}", file=sys.stderr)
    if out is None:
        sys.stdout.write(text)
    else:
        atomic_write(out, text)
        print(f"wrote {out} (context {mapped.context})", file=sys.stderr)
    return 0
