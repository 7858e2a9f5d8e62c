"""Collective and point-to-point communication times on a node/network topology.

The op graph knows nothing of links: a communication op names its kind
(all_reduce, all_gather, reduce_scatter, all_to_all, send), its bytes and the
group it runs over. This module knows nothing of transformers: it turns
(kind, bytes, group) into seconds with the usual latency + bandwidth model of
NCCL's algorithms (Thakur et al., "Optimization of Collective Communication
Operations in MPICH", IJHPCA 2005; NCCL's ring and double binary tree):

- ring all-reduce:       c + 2(n-1) * a + 2(n-1)/n * S / B
- tree all-reduce:       same bandwidth term, latency c + 2 * (log2(nodes) * a_net + (g-1) * a_nvlink)
  (NCCL picks the faster; trees only matter across nodes, where ring latency grows with n)
- all-gather, reduce-scatter (ring): c + (n-1) * a + (n-1)/n * S / B, S = the full (gathered) buffer
- all-to-all: the share of S bound for other nodes crosses the NIC, the rest NVLink, at once
- send/recv: c + a + S / B_link

c is the fixed cost of one collective call (the profile's gpu_link latency: on
2 H200s through torch.distributed it is the 34 us intercept of the measured
sweep), a the latency of one ring step: NVLINK_HOP_S inside a node, the
profile's network latency between nodes.

B is the group's bus bandwidth per GPU. Inside one node it is the GPU's
NVLink bandwidth (on a switchless mesh such as the quad GH200 node, a GPU
reaches g-1 peers at the per-pair rate, so B = min(total, (g-1) * per_pair)).
Across nodes NCCL runs one ring per NIC, each crossing every node once: with
g members of the group per node, each with its own NIC, B = min(NVLink, g * NIC).
Concurrent groups (the 8 data-parallel groups of a TP-8 job) use disjoint
GPUs and NICs, so they do not share this bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ghsim.graph.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER, SEND, Group
from ghsim.graph.ops import Collective
from ghsim.hardware import Hardware

# NCCL runs one CTA per channel, each on its own SM, for the whole collective.
# Assumption: 16 channels for a large collective on NVLink-connected Hopper/Ampere
# (NCCL caps channels at NCCL_MAX_CTAS, 32 by default in recent releases; rings on
# NVSwitch systems commonly settle at 16-24). Used for the SM share that
# concurrent compute loses while a collective runs (see sim/engine.py): 12% of an
# H100/H200's 132 SMs, inside the 0-19% we measured on 2x H200 (validation/README.md,
# "Compute and communication at once"), which also shows collectives slowed by compute:
# not modelled (a two-pass what-if moves the 2x H200 cases by at most 1.2 points).
NCCL_CTAS = 16
# Assumption: one ring step over NVLink adds ~1 us (NCCL's LL protocol; nccl-tests small-message
# all-reduce latency grows by roughly that per extra GPU inside a DGX/HGX node).
NVLINK_HOP_S = 1e-6


@dataclass(frozen=True)
class Fabric:
    """Per-GPU, per-direction link figures (bytes/s, seconds)."""

    nvlink_bw: float  # one GPU to all its NVLink peers together
    nvlink_peer_bw: float  # one GPU pair on a switchless mesh; 0 where a switch gives any pair the full rate
    call_latency: float  # fixed cost of one collective call
    net_bw: float  # one GPU's share of its node's NICs
    net_latency: float  # one ring step between nodes
    nvlink_latency: float = NVLINK_HOP_S  # one ring step inside a node

    @staticmethod
    def of(hw: Hardware) -> "Fabric":
        return Fabric(hw.gpu_link.bandwidth, hw.gpu_link.per_peer, hw.gpu_link.latency_s,
                      hw.network.bandwidth, hw.network.latency_s)

    def intra_node_bw(self, members: int) -> float:
        """Bandwidth one GPU gets to `members - 1` peers in its node."""
        if self.nvlink_peer_bw > 0:
            return min(self.nvlink_bw, (members - 1) * self.nvlink_peer_bw)
        return self.nvlink_bw

    def bus_bw(self, group: Group) -> float:
        g = group.per_node
        intra = self.intra_node_bw(g) if g > 1 else math.inf
        if group.nodes == 1:
            return intra
        return min(intra, g * self.net_bw)

    def step_latency(self, group: Group) -> float:
        return self.nvlink_latency if group.nodes == 1 else self.net_latency


def collective_time(kind: Collective, nbytes: float, group: Group, fabric: Fabric, calls: int = 1) -> float:
    """Seconds for `calls` collectives moving `nbytes` in total over `group`.

    `nbytes` is the full buffer: the tensor for all-reduce, the gathered
    output for all-gather, the input for reduce-scatter, what one rank sends
    for all-to-all and send. Each call pays the latency term once.
    """
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    calls = max(1, calls)
    a, c = fabric.step_latency(group), fabric.call_latency
    if kind == SEND:
        return nbytes / _p2p_bw(group, fabric) + calls * (c + a)
    if kind == ALL_TO_ALL:
        return _all_to_all(nbytes, group, fabric) + calls * (c + a)
    bw = fabric.bus_bw(group)
    if kind == ALL_REDUCE:
        ring_latency = 2 * (n - 1) * a
        if group.nodes > 1:
            tree = 2 * (math.ceil(math.log2(group.nodes)) * fabric.net_latency
                        + (group.per_node - 1) * fabric.nvlink_latency)
            ring_latency = min(ring_latency, tree)
        return 2 * (n - 1) / n * nbytes / bw + calls * (c + ring_latency)
    if kind in (ALL_GATHER, REDUCE_SCATTER):
        return (n - 1) / n * nbytes / bw + calls * (c + (n - 1) * a)
    raise ValueError(f"unknown collective {kind!r}")


def _p2p_bw(group: Group, fabric: Fabric) -> float:
    """Point-to-point between neighbours of `group` (pipeline stages)."""
    if group.per_node > 1:
        return fabric.nvlink_peer_bw or fabric.nvlink_bw
    return fabric.net_bw


def _all_to_all(nbytes: float, group: Group, fabric: Fabric) -> float:
    n, g = group.size, min(group.per_node, group.size)
    intra_share = (g - 1) / n * nbytes
    inter_share = (n - g) / n * nbytes
    t_intra = intra_share / fabric.intra_node_bw(g) if g > 1 else 0.0
    t_inter = inter_share / fabric.net_bw if inter_share > 0 else 0.0
    return max(t_intra, t_inter)
