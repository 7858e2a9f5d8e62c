"""Communicators as the op graph names them: which ranks a collective runs over.

A collective op names its kind (ops.Collective), its bytes and its group; how
fast that group's links are is cost/links.py's business, not the graph's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ghsim.graph.ops import Collective

# Short names for the collective kinds (graph/parallel.py spells them so).
ALL_REDUCE = Collective.ALL_REDUCE
ALL_GATHER = Collective.ALL_GATHER
REDUCE_SCATTER = Collective.REDUCE_SCATTER
ALL_TO_ALL = Collective.ALL_TO_ALL
SEND = Collective.SEND


@dataclass(frozen=True)
class Group:
    """A communicator: `size` ranks, `per_node` of them inside each node they span."""

    name: str
    size: int
    per_node: int

    @property
    def nodes(self) -> int:
        return math.ceil(self.size / self.per_node)
