"""State layout: model variables ⇄ state-vector rows, row distribution over ranks."""

from ..parallel.distribution import block_distribution
from .block import EnsembleBlock
from .coords import StateGeometry
from .index import state_index
from .state import Segment, StateLayout, VariableLayout, VarMeta, build_layout

__all__ = [
    "EnsembleBlock",
    "Segment",
    "StateGeometry",
    "StateLayout",
    "VarMeta",
    "VariableLayout",
    "block_distribution",
    "build_layout",
    "state_index",
]
