"""A pipeline schedule's op graph (graph/pipeline.py) run on the engine."""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph.ops import OpGraph
from ghsim.graph.pipeline import ChunkTimes, PipelineSegment, StageTail, build_pipeline
from ghsim.sim import engine


@dataclass(frozen=True)
class PipelineRun:
    graph: OpGraph
    resources: list[engine.Resource]
    schedule: engine.Schedule
    stage_of: list[int]  # stage of each op
    segment: list[PipelineSegment]


def schedule_pipeline(pp: int, v: int, M: int, chunks: list[ChunkTimes], tails: list[StageTail],
                      loader_s: float = 0.0) -> PipelineRun:
    """Schedule M micro-batches through pp stages of v chunks each; chunks[j] is virtual stage j
    (`loader_s`: graph/pipeline.build_pipeline)."""
    built = build_pipeline(pp, v, M, chunks, tails, loader_s)
    resources = [engine.Resource(name) for name in built.resources]
    n = len(built.graph)
    sched = engine.run(resources, built.resource_of, built.durations, built.graph.deps, [0.0] * n, [False] * n)
    return PipelineRun(built.graph, resources, sched, built.stage_of, built.segment)
