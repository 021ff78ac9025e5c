"""The filter names, defined once (standard library only).

Every filter is an ensemble-space *variant* (how one transform is formed
from observation sums, :mod:`ensio.analysis.variants`) run either globally
(one transform from all observations: the variant's name) or locally (one
transform per grid point from the observations within the support radius:
``"l"`` + the variant's name). This module is the registry of variant names:
the config's allowed ``analysis.filter`` values derive from it, and
:mod:`ensio.analysis.variants` registers one variant object under each name
(and checks at import that none is missing).

Why here and not in ``analysis/``: the config is loaded by every worker job
of the dynamic job scheme, which must start without importing numpy, and the
config room imports nothing of ensio.
"""

from __future__ import annotations

__all__ = ["FILTER_NAMES", "GLOBAL_FILTERS", "LOCAL_FILTERS", "VARIANT_NAMES", "local_name"]

#: Ensemble-space variants, each implemented by a class in ``analysis/variants.py``.
VARIANT_NAMES: tuple[str, ...] = ("etkf", "estkf", "enkf")


def local_name(variant: str) -> str:
    """The name of the localized filter of ``variant`` (``etkf`` → ``letkf``)."""
    return "l" + variant


#: Global filters: one transform from the full observation set.
GLOBAL_FILTERS: frozenset[str] = frozenset(VARIANT_NAMES)
#: Local filters: one transform per analysis point (need ``analysis.localization``).
LOCAL_FILTERS: frozenset[str] = frozenset(local_name(v) for v in VARIANT_NAMES)
#: Every ``analysis.filter`` value, globals first.
FILTER_NAMES: tuple[str, ...] = VARIANT_NAMES + tuple(local_name(v) for v in VARIANT_NAMES)
