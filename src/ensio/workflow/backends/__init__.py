"""Job back-ends by name: the registry behind ``workflow.backend``.

Adding a scheduler: a :class:`~ensio.workflow.backends.batch.BatchBackend`
subclass (class attributes + a script function) in its own module, one entry
in :data:`BACKENDS`, its name in ``config.workflow.BackendName`` (the config
room imports nothing of ensio, so the name is spelt there too; a test keeps
the two equal), and a test of its script function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...config.errors import ConfigError
from .base import Backend, JobShape, JobSpec, JobState
from .local import LocalBackend
from .slurm import SlurmBackend

if TYPE_CHECKING:
    from ...config.workflow import WorkflowSection

__all__ = ["BACKENDS", "Backend", "JobShape", "JobSpec", "JobState", "backend_from_config"]

#: ``workflow.backend`` -> back-end class.
BACKENDS: dict[str, type[Backend]] = {"local": LocalBackend, "slurm": SlurmBackend}


def backend_from_config(wf: WorkflowSection, shape: JobShape | None = None) -> Backend:
    """The back-end ``workflow.backend`` names, for jobs of ``shape``.

    Raises
    ------
    ConfigError
        If the name is not registered or its options (``workflow.<name>``) are
        refused; the message names the key.
    """
    try:
        cls = BACKENDS[wf.backend]
    except KeyError:
        raise ConfigError(f"workflow.backend: unknown back-end {wf.backend!r} "
                          f"(known: {', '.join(sorted(BACKENDS))})") from None
    try:
        return cls.from_config(wf, shape or JobShape())
    except ValueError as exc:
        raise ConfigError(f"workflow.{wf.backend}: {exc}") from None
