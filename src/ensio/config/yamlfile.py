"""Reading a YAML file the one safe way, with the one-line errors users see.

Every config the project reads (the main config, the ``ioserver:`` section, a
transfer config, the one ``workflow.transfer`` names) is parsed here: always
``yaml.safe_load`` (no object construction from tags), and an unreadable or
malformed file is a :class:`ConfigError` naming the file, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["read_yaml"]


def read_yaml(path: str | Path, what: str = "config file", prefix: str = "") -> Any:
    """The parsed content of ``path`` (``None`` for an empty file).

    Raises
    ------
    ConfigError
        ``<prefix><path>: cannot read <what> (<reason>)`` or
        ``<prefix><path>: not valid YAML (<first line of the parser's message>)``.
    """
    import yaml  # here, not at the top: the worker imports this module and reads no YAML

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        reading = f"cannot read {what}" if what else "cannot read"
        raise ConfigError(f"{prefix}{path}: {reading} ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{prefix}{path}: not valid YAML "
                          f"({str(exc).splitlines()[0]})") from None
