"""What simulating one plan builds, kept for the plan's next question.

The plan search asks one plan several questions in turn (simulate_prepared.prepare(),
step_memory(), step_floors.step_time_floor(), simulate_prepared()); each builds on what the
earlier ones built. PlanBuild holds it in named fields, and the caller holds the
PlanBuild: nothing is cached behind its back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ghsim.cost.calibration import Calibration
from ghsim.cost.compute import CostModel, LaunchCosts
from ghsim.cost.hostlink import HostSide
from ghsim.cost.links import Fabric, collective_time
from ghsim.graph import ops as K
from ghsim.graph.collectives import Group
from ghsim.graph.offload import OffloadSetup
from ghsim.graph.ops import Op
from ghsim.graph.parallel import Layout, MicrobatchGraph
from ghsim.graph.step import LayerTemplates
from ghsim.graph.unified_memory import UnifiedMemoryUse
from ghsim.hardware import Hardware
from ghsim.plan import Plan

if TYPE_CHECKING:
    from ghsim.simulate import MicrobatchRun, StepMemory


@dataclass(frozen=True)
class RankPricing:
    """What pricing one rank's work takes: its layout, links, host share and cost model."""

    layout: Layout
    cost: CostModel
    fabric: Fabric
    host_side: HostSide
    groups: dict[str, Group]  # the rank's communicators by stream (Layout.groups())

    @staticmethod
    def of(hw: Hardware, plan: Plan, calibration: Calibration, fabric: Fabric | None = None,
           host_side: HostSide | None = None) -> "RankPricing":
        host_side = host_side or HostSide.of(hw, plan, calibration)  # host link, CPU and memory shared per node
        layout = Layout.of(plan, hw)
        corrections = calibration.overlay.corrections(plan) if calibration.overlay is not None else None
        return RankPricing(layout, CostModel(hw, calibration, host_side, LaunchCosts.of(hw, calibration, plan),
                                             corrections),
                           fabric or Fabric.of(hw), host_side, layout.groups())

    def comm_time(self, kind: str, nbytes: float, stream: str, calls: int) -> float:
        return collective_time(kind, nbytes, self.groups[stream], self.fabric, calls)

    def price(self, op: Op) -> float:
        """Seconds of one op on this rank: a collective over its group's links, the rest by the cost model."""
        if op.kind == K.COLLECTIVE:
            return self.comm_time(op.variant, op.bytes, op.resource, op.kernels)
        return self.cost.duration(op)


class PriceBook:
    """The seconds of each distinct op priced for one plan. Replicated layers share op objects
    and every run of the plan reuses them, so each is priced once; the book keeps the ops it
    priced, so an id it holds is never reused by another op."""

    def __init__(self, rank: RankPricing) -> None:
        self._rank = rank
        self._seen: dict[int, tuple[Op, float]] = {}

    def __call__(self, op: Op) -> float:
        hit = self._seen.get(id(op))
        if hit is None:
            hit = self._seen[id(op)] = (op, self._rank.price(op))
        return hit[1]


@dataclass(frozen=True)
class GraphKey:
    """Which micro-batch graph: its chunk's layers and kind (embedding, loss), and whether it is
    the step's last micro-batch."""

    layers: int
    kind: tuple[bool, bool]
    final: bool


@dataclass(eq=False)
class PlanBuild:
    """One plan's pricing and what has been built for it so far (see the module docstring)."""

    rank: RankPricing
    offload: OffloadSetup  # the plan's offload, resolved once
    templates: LayerTemplates  # the rank's op templates, unpriced
    prices: PriceBook
    graphs: dict[GraphKey, MicrobatchGraph] = field(default_factory=dict)
    runs: dict[GraphKey, "MicrobatchRun"] = field(default_factory=dict)  # graphs run at kernel level
    memory: "StepMemory | None" = None
    unified_memory: UnifiedMemoryUse | None = None  # what spills under --unified-memory

    @property
    def layout(self) -> Layout:
        return self.rank.layout
