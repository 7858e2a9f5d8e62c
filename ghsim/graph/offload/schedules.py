"""The offload schedules' insertions: activation copies, parameter fetches, and the offloaded
optimizer (gradients down, the CPU's share of AdamW, parameters back; plain PyTorch's sync
variant). graph/offload.py says what each schedule does and applies them."""

from __future__ import annotations

import math

from ghsim.graph import ops as K
from ghsim.graph.deepspeed_optimizer import offload_grad_checks
from ghsim.graph.offload.ops import _gpu_adam, _marker, blocking_cast, copy_op, cpu_adam, cpu_bytes, gpu_cast
from ghsim.graph.offload.rewrite import BWD, FWD, New
from ghsim.graph.offload.setup import GradSource, OffloadSetup, Widths
from ghsim.graph.ops import Op, OpGraph, Phase, Resource
from ghsim.graph.zero3_window import layers_kept_for_backward
from ghsim.plan import CpuOptimizer, OffloadSchedule

# bound once: read per run and per gradient source below (see graph/ops.py on member reads)
OPT = Phase.OPT
_GPU, _DP, _CPU, _H2D, _D2H = Resource.GPU, Resource.DP, Resource.CPU, Resource.H2D, Resource.D2H


def _activation_copies(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd) -> None:
    """Each layer's saved activations leave after its forward and are prefetched one layer ahead."""
    saved = facts.saved_per_layer
    if saved <= 0:
        return
    d2h = copy_op("activations.d2h", K.D2H, saved, FWD, setup, _D2H, duplex=duplex_fwd).evolve(
        (("activations", -saved),), host_alloc=saved, mem_tag="offloaded_activations")
    h2d = copy_op("activations.h2d", K.H2D, saved, BWD, setup, _H2D, duplex=duplex_bwd).evolve(
        (("activations", saved),), host_free=saved, mem_tag="offloaded_activations")
    for mb, dirs in by_mb.items():
        sent = {}
        for run in dirs[FWD]:
            if run.layer >= 0:
                sent[run.layer] = rw.insert_after(run.last, new(d2h, [run.last], run.layer, mb))
        bwd = dirs[BWD]
        for k, run in enumerate(bwd):
            if run.layer < 0 or run.layer not in sent:
                continue
            ahead = bwd[k - 1] if k > 0 else run  # prefetch while the previous backward run computes
            fetch = rw.insert_before(ahead.first, new(h2d, [sent[run.layer]], run.layer, mb))
            rw.add_dep(run.first, fetch)


def _parameter_fetches(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd, gathers) -> None:
    """Layer parameters come from the host one layer ahead into a GPU buffer, forward and backward.

    FSDP (sync) fetches the fp32 flat parameter and casts it on the GPU; ZeRO-Infinity
    fetches the bf16 working copy. At most two layer buffers are in flight. With ZeRO-3
    over several ranks (`gathers`), each rank fetches its shard just before the layer's
    all-gather, which the gather waits for (the cast runs on the gather's stream). DeepSpeed
    keeps the last layers' buffers from their forward to their backward (no second fetch).
    """
    P = facts.layer_params / setup.shard
    fsdp = setup.fsdp_like
    width = 4 if fsdp else 2
    buffer = P * facts.gpu_param_width if not fsdp else P * 2
    for mb, dirs in by_mb.items():
        layers = sorted({r.layer for r in dirs[FWD] if r.layer >= 0})
        kept = set(layers[len(layers) - _layers_kept_for_backward(facts, setup, len(layers)):]) if layers else set()
        for direction, duplex in ((FWD, duplex_fwd), (BWD, duplex_bwd)):
            seq = dirs[direction]
            stream = _GPU if setup.params_on_compute_stream else _H2D
            fetch_op = copy_op(f"params.h2d.{direction}", K.H2D, P * width, direction, setup, stream,
                               duplex=duplex).with_hbm("param_buffers", buffer)
            release = _marker(f"params.release.{direction}", direction).with_hbm("param_buffers", -buffer)
            casts = {s: gpu_cast(f"params.cast.{direction}", P, direction, s) for s in (_GPU, _DP)} if fsdp else {}
            layer_runs = [(k, r) for k, r in enumerate(seq) if r.layer >= 0]
            for n, (k, run) in enumerate(layer_runs):
                # fetched in forward, not again in backward: one rank keeps the fetched buffer itself to its
                # backward, ranks that gather shards keep the gathered layer (graph/parallel.py) and free
                # the shard's copy after the forward
                held = run.layer in kept
                buffer_kept = held and setup.shard == 1
                if not (held and direction == BWD):
                    gather = gathers.get((direction, run.layer))
                    consumer = run.first if gather is None else gather
                    ahead = seq[k - 1].first if k > 0 and gather is None else consumer
                    deps = [layer_runs[n - 2][1].last] if n >= 2 else []  # its buffer is free again
                    fetch = rw.insert_before(ahead, new(fetch_op, deps, run.layer, mb))
                    if casts:
                        fetch = rw.insert_before(consumer, new(casts[_GPU if gather is None else _DP], [fetch],
                                                               run.layer, mb))
                    rw.add_dep(consumer, fetch)
                if (not held or buffer_kept) if direction == BWD else not buffer_kept:
                    rw.insert_after(run.last, new(release, [], run.layer, mb))


def _layers_kept_for_backward(facts, setup: OffloadSetup, layers: int) -> int:
    """DeepSpeed ZeRO-3 + offload_param: the last layers whose parameters stay on the GPU from forward
    into backward, not fetched again (graph/zero3_window.py)."""
    if not setup.max_live:
        return 0
    return layers_kept_for_backward(setup.max_live, facts.head_params, facts.layer_params, layers)


def _bucket_count(nbytes: float, setup: OffloadSetup, link_bucket: float) -> int:
    """Copies a run's gradients take: DeepSpeed's fixed buckets, or buckets sized to the link
    (`link_bucket` bytes: SuperOffload's, from Widths)."""
    if setup.schedule == OffloadSchedule.SUPEROFFLOAD:
        bucket = link_bucket
    elif setup.schedule == OffloadSchedule.OVERLAPPED:
        bucket = setup.bucket_elements * 2
    else:
        return 1
    return max(1, math.ceil(nbytes / bucket))


def _run_sources(graph: OpGraph, by_mb, grad_width: float) -> list[GradSource]:
    """One GPU's whole step: each backward run's gradients leave after it, in every micro-batch."""
    per_run_bytes = _grad_bytes_per_run(graph, by_mb)
    out = []
    for mb in sorted(by_mb):
        runs = by_mb[mb][BWD]
        for run in runs:
            k = (run.layer, run.first - runs[0].first)
            if k not in per_run_bytes:
                continue
            held = sum((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) for i in range(run.first, run.last + 1))
            out.append(GradSource(run.last, per_run_bytes[k] / grad_width, held, k, run.layer, mb, mb > 0))
    return out


def _optimizer(rw, sources: list[GradSource], plan, facts, setup, new, grad_width, duplex_bwd, widths: Widths,
               steps: bool) -> None:
    """Gradients to the host, the CPU's share of AdamW, updated parameters back; the GPU's share.
    `steps`: the optimizer follows (else only the gradients leave, to be accumulated on the host)."""
    sched = setup.schedule
    P = facts.trainable
    on_cpu, taken = _cpu_pieces(sources, setup.cpu_share * P)
    cpu_params, gpu_params = taken / setup.shard, (P - taken) / setup.shard
    last_mb = max((s.mb for s in sources), default=0)
    ready = sorted({s.after for s in sources if s.mb == last_mb})  # every gradient of the step is reduced

    if sched == OffloadSchedule.SYNC and not setup.params:
        if steps:
            _sync_optimizer(rw, facts, setup, new, grad_width, cpu_params, gpu_params, plan, ready)
        return
    # alike pieces (every layer's) share their op objects, priced once; only ops without tagged
    # HBM changes are shared, so that the memory breakdown adds the same numbers in the same order
    alike: dict[tuple, Op] = {}
    arrivals = _grads_to_host(rw, sources, on_cpu, setup, new, widths, duplex_bwd, last_mb, alike, grad_width, steps)
    if not steps:
        return
    if gpu_params > 0:  # the GPU's share, after backward (and its gradients' reduction), on the compute stream
        tensors = max(1, int(facts.n_tensors * gpu_params * setup.shard / max(P, 1)))
        kept = [s.after for s in sources if s.mb == last_mb and s.key not in on_cpu]
        rw.append(new(_gpu_adam(gpu_params, tensors, plan), kept))
    _host_steps(rw, arrivals, setup, new, widths, duplex_bwd, last_mb, alike, facts.tensor_elements)


def _cpu_pieces(sources: list[GradSource], target: float) -> tuple[set, float]:
    """The CPU takes the first `target` parameters' gradients in backward order (whole pieces);
    the GPU keeps the tail, with its optimizer states (SuperOffload's tail buckets). Returns the
    keys of the CPU's pieces and their parameters."""
    taken, on_cpu = 0.0, set()
    first_mb = min((s.mb for s in sources), default=0)
    for src in sources:
        if src.mb == first_mb and src.params > 0 and taken + src.params <= target * (1 + 1e-9):
            on_cpu.add(src.key)
            taken += src.params
    return on_cpu, taken


def _shared(alike: dict[tuple, Op], key: tuple, make) -> Op:
    """The op `make()` builds, built once per `key` in one rewrite."""
    op = alike.get(key)
    if op is None:
        op = alike[key] = make()
    return op


def _grads_to_host(rw, sources, on_cpu, setup, new, widths: Widths, duplex_bwd, last_mb: int,
                   alike: dict[tuple, Op], grad_width: int, steps: bool) -> list[tuple[New, float, GradSource]]:
    """Each CPU piece's gradients down to the host (cast on the GPU or the CPU, accumulated on the
    host after the first micro-batch); returns each last-micro-batch piece's last op on its way.
    `steps`: the step's accumulation boundary is in this graph (its last micro-batch)."""
    arrivals: list[tuple[New, float, GradSource]] = []
    for src in sources:
        if src.key not in on_cpu:
            continue
        params = src.params / setup.shard
        at, mb, layer = src.after, src.mb, src.layer
        deps: list = [at]
        lane = src.stream if setup.grads_on_compute_stream else _D2H
        if setup.grad_round_trip:  # through the pinned 16-bit buffer and back, on the copies' stream
            for name, kind in (("grads.to_pinned16", K.D2H), ("grads.from_pinned16", K.H2D)):
                hop = _shared(alike, (name, params, lane), lambda: copy_op(
                    name, kind, params * 2, BWD, setup, lane).evolve(pinned=True))
                deps = [rw.insert_after(at, new(hop, deps, layer, mb))]
        if setup.gpu_grad_checks:
            boundary = steps and mb == last_mb
            checks = _shared(alike, ("ds.grad_checks", params, src.stream, boundary),
                             lambda: offload_grad_checks(params, int(grad_width), src.stream, boundary))
            for op in checks:
                deps = [rw.insert_after(at, new(op, deps, layer, mb))]
        if widths.grad_gpu_cast:
            cast = _shared(alike, ("grads.cast_fp32", params, src.stream),
                           lambda: gpu_cast("grads.cast_fp32", params, BWD, src.stream))
            deps = [rw.insert_after(at, new(cast, deps, layer, mb))]
        nbytes = params * widths.grad
        d2h = _shared(alike, ("grads.d2h", nbytes, lane), lambda: copy_op(
            "grads.d2h", K.D2H, nbytes, BWD, setup, lane, _bucket_count(nbytes, setup, widths.bucket_d2h),
            duplex_bwd))
        if src.held > 0:  # the GPU gradient is freed once it has left
            d2h = d2h.with_hbm("grads", -src.held)
        last = rw.insert_after(at, new(d2h, deps, layer, mb))
        if setup.gpu_grad_handoff:  # DeepSpeed 0.18: the worker copies the handed-over GPU gradient itself
            worker = _shared(alike, ("grads.d2h.worker", params), lambda: copy_op(
                "grads.d2h.worker", K.D2H, params * 4, BWD, setup, _D2H, 1, duplex_bwd))
            last = rw.insert_after(at, new(worker, [last], layer, mb))
        if widths.grad_cpu_cast:
            cast = _shared(alike, ("grads.cast_fp32.cpu", params),
                           lambda: cpu_bytes("grads.cast_fp32.cpu", params * 6, BWD, False))
            last = rw.insert_after(at, new(cast, [last], layer, mb))
        if src.accumulate:  # accumulate into the fp32 host gradient: read both, write one
            add = _shared(alike, ("grads.accumulate.cpu", params),
                          lambda: cpu_bytes("grads.accumulate.cpu", params * 12, BWD, False))
            last = rw.insert_after(at, new(add, [last], layer, mb))
        if mb == last_mb:
            arrivals.append((last, params, src))
    return arrivals


def _host_steps(rw, arrivals, setup, new, widths: Widths, duplex_bwd, last_mb: int, alike: dict[tuple, Op],
                tensors: tuple[int, ...]) -> None:
    """The CPU's AdamW on each piece that arrived (priced over the model's `tensors`), its cast, and
    the updated parameters back."""
    if setup.serial_grad_copies:
        _zero_offload_step(rw, arrivals, setup, new, widths, last_mb, alike, tensors)
        return
    superoffload = setup.speculative
    main_thread = setup.schedule != OffloadSchedule.SUPEROFFLOAD  # else its CPU-Adam runs in a worker process
    returns = not setup.params  # else the next step fetches the updated parameters
    barrier = [a for a, _, _ in arrivals]  # ZeRO-Offload: the global gradient norm needs all of them
    clips = (setup.grad_clip or setup.host_unscale) and not superoffload
    prev = _host_clip(rw, arrivals, setup, new, last_mb, alike) if clips else None
    later: list[New] = []
    step_params = sum(params for _, params, _ in arrivals)
    # DeepSpeed stage 3 copies each updated sub-group up whole (stage3.py
    # _reassign_or_swap_out_partitioned_parameters: fp16_partitioned_groups_flat[i].data.copy_(fp32 flat));
    # torch casts it on the CPU into a fresh 16-bit tensor first (host_memory.json cast_temp)
    cast_temporary = 2.0 * min(step_params, setup.sub_group) if returns else 0.0
    for arrived, params, src in arrivals:
        deps = ([arrived] if superoffload else list(barrier)) + ([prev] if prev is not None else [])
        adam = _shared(alike, ("cpu_adamw", params), lambda: cpu_adam("cpu_adamw", params, setup, main_thread, tensors,
                                                                     step_params))
        chain = [new(adam, deps, src.layer, last_mb)]
        if widths.param_cpu_cast:
            # before DeepSpeed stage 3's blocking copy up, torch casts on the training thread
            cast = _shared(alike, ("params.cast_bf16.cpu", params), lambda: blocking_cast(
                "params.cast_bf16.cpu", params, OPT, cast_temporary) if setup.pageable_param_return else cpu_bytes(
                "params.cast_bf16.cpu", params * 6, OPT, main_thread))
            chain.append(new(cast, [chain[-1]], src.layer, last_mb))
        prev = chain[-1]
        if returns:
            nbytes = params * widths.param
            # DeepSpeed's stage-3 return: the training thread copies each piece up from pageable
            # memory before it steps the next one; otherwise a copy engine takes it, bucketed
            pageable = setup.pageable_param_return
            h2d = _shared(alike, ("params.h2d", nbytes, pageable), lambda: _params_up(
                nbytes, setup, widths, pageable, superoffload and duplex_bwd))
            chain.append(new(h2d, [prev], src.layer, last_mb))
            if pageable:
                prev = chain[-1]
            if widths.param_gpu_cast:
                cast = _shared(alike, ("params.cast_bf16", params), lambda: gpu_cast("params.cast_bf16", params, OPT))
                chain.append(new(cast, [chain[-1]], src.layer, last_mb))
        if superoffload:
            # speculative: the CPU steps right behind each bucket, during backward; the copies
            # back are queued after backward's own host-to-device traffic
            cpu_part = [n for n in chain if n.op.resource == _CPU]
            for n in cpu_part:
                rw.insert_after(src.after, n)
            later.extend(n for n in chain if n.op.resource != _CPU)
        else:
            for n in chain:  # tile by tile: each layer's copy leaves while the CPU updates the next
                rw.append(n)
    if setup.rollback_clip:
        passes = [(name, lambda p, name=name: cpu_adam(name, p, setup, True, tensors))
                  for name in ("cpu_adamw.rollback", "cpu_adamw.redo")]
        passes.insert(1, ("grads.clip.cpu", lambda p: cpu_bytes("grads.clip.cpu", p * 8, OPT, True)))
        _in_turn(rw, arrivals, barrier, passes, new, last_mb, alike)  # after the speculative steps, in order
    if setup.host_unscale and superoffload:  # 0.18's step scales the CPU sub-groups' gradients after backward
        unscale = [("grads.unscale.cpu", lambda p: cpu_bytes("grads.unscale.cpu", p * 8, OPT, True))]
        _in_turn(rw, arrivals, barrier, unscale, new, last_mb, alike)
    for n in later:
        rw.append(n)


def _params_up(nbytes: float, setup: OffloadSetup, widths: Widths, pageable: bool, duplex: bool) -> Op:
    """The updated parameters' copy to the GPU: from pageable memory by the training thread, or
    bucketed on the copy engine."""
    if pageable:
        return copy_op("params.h2d", K.H2D, nbytes, OPT, setup, _H2D).evolve(pinned=False, host_waits=True)
    return copy_op("params.h2d", K.H2D, nbytes, OPT, setup, _H2D, _bucket_count(nbytes, setup, widths.bucket_h2d),
                   duplex)


def _in_turn(rw, arrivals, deps: list, passes, new, last_mb: int, alike: dict[tuple, Op]):
    """Each pass over every arrived piece, one pass after another and piece after piece: `passes`
    are (name, make(params) -> Op); the first op waits for `deps`. Returns the last op (None when
    no piece arrived)."""
    last = None
    for name, make in passes:
        for _, params, src in arrivals:
            op = _shared(alike, (name, params), lambda: make(params))
            last = rw.append(new(op, deps, src.layer, last_mb))
            deps = [last]
    return last


def _host_clip(rw, arrivals, setup, new, last_mb: int, alike: dict[tuple, Op]):
    """Clipping host gradients by their global norm, once all have arrived. torch's
    clip_grad_norm_ (FSDP2 CPU offload) computes the norm with _foreach_norm, which on CPU
    tensors reads at near one thread's rate (priced at its microbenchmark, cpu_optimizers.toml
    foreach_norm_bandwidth), then scales them in place on every thread; DeepSpeed's stage 3 scales them on the host (the
    norm comes from the GPU)."""
    norm = [("grads.norm.cpu", lambda p: cpu_bytes("grads.norm.cpu", p * 4, OPT, True, True))]
    clip = [("grads.clip.cpu", lambda p: cpu_bytes("grads.clip.cpu", p * 8, OPT, True))]
    passes = (norm if setup.cpu_impl != CpuOptimizer.DEEPSPEED else []) + clip
    return _in_turn(rw, arrivals, [a for a, _, _ in arrivals], passes, new, last_mb, alike)


def _zero_offload_step(rw, arrivals, setup, new, widths: Widths, last_mb: int, alike: dict[tuple, Op],
                       tensors: tuple[int, ...]) -> None:
    """DeepSpeed 0.19's ZeRO-Offload step at stage 1/2 (stage_1_and_2.py, one parameter group),
    as its profiler trace shows it (validation/measured_libraries): once every fp32 gradient is
    on the host, the training thread reads them for the global norm, scales them in place when
    clipping, runs DeepSpeedCPUAdam over the whole partition, narrows the fp32 partition to the
    16-bit copy, and only then copies the parameters up. Pass by pass, nothing overlaps."""
    passes = [("grads.norm.cpu", lambda p: cpu_bytes("grads.norm.cpu", p * 4, OPT, True))]
    if setup.grad_clip:
        passes.append(("grads.clip.cpu", lambda p: cpu_bytes("grads.clip.cpu", p * 8, OPT, True)))
    step_params = sum(params for _, params, _ in arrivals)  # one step over all pieces holds its temporaries
    passes.append(("cpu_adamw", lambda p: cpu_adam("cpu_adamw", p, setup, True, tensors, step_params)))
    if widths.param_cpu_cast:
        passes.append(("params.cast_bf16.cpu", lambda p: cpu_bytes("params.cast_bf16.cpu", p * 6, OPT, True)))
    if not setup.params:
        passes.append(("params.h2d", lambda p: _params_up(p * widths.param, setup, widths, False, False)))
    _in_turn(rw, arrivals, [a for a, _, _ in arrivals], passes, new, last_mb, alike)


def _grad_bytes_per_run(graph: OpGraph, by_mb) -> dict[tuple[int, int], float]:
    """Gradient bytes each backward run creates, keyed by (layer, offset in the micro-batch),
    measured on micro-batch 0 (later ones accumulate into the same tensors)."""
    out: dict[tuple[int, int], float] = {}
    runs = by_mb[0][BWD]
    if not runs:
        return out
    base = runs[0].first
    for run in runs:
        g = sum(max((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0), 0.0) for i in range(run.first, run.last + 1))
        if g > 0:
            out[(run.layer, run.first - base)] = g
    return out


def _sync_optimizer(rw, facts, setup, new, grad_width, cpu_params, gpu_params, plan, ready: list[int]) -> None:
    """Plain PyTorch after backward (validation/harness/train_step.py): every gradient copied to
    pinned host memory on the compute stream, a sync, torch's AdamW on the CPU, the
    parameters copied back, a sync. Gradients stay allocated on the GPU (p.grad).
    The host masters are fp32; with 16-bit weights on the GPU each non_blocking copy_ casts on
    the GPU and moves fp32 both ways (torch's copy_ between devices; the plain loop's trace:
    12.85 GB down and up for 3.2e9 bf16 parameters, offload_calibration.py cast_copies: 52 GB/s).
    `ready`: ops after which every gradient is final (the last reductions, with several GPUs)."""
    if gpu_params > 0:
        rw.append(new(_gpu_adam(gpu_params, facts.n_tensors, plan), ready))
    if cpu_params <= 0:
        return
    tensors = max(1, int(facts.n_tensors * cpu_params / max(facts.trainable, 1)))
    # one tensor's fp32 copy exists at a time: its transient HBM is left out
    cast = gpu_cast("grads.cast_fp32", cpu_params, OPT).evolve(hbm_transient=0.0, kernels=tensors)
    if grad_width < 4:
        ready = [rw.append(new(cast, ready))]
    d2h_op = copy_op("grads.d2h", K.D2H, cpu_params * 4, OPT, setup, _GPU, tensors)
    d2h = rw.append(new(d2h_op.evolve(host_waits=True), ready))
    adam = rw.append(new(cpu_adam("cpu_adamw", cpu_params, setup, True, facts.tensor_elements), [d2h]))
    h2d_op = copy_op("params.h2d", K.H2D, cpu_params * 4, OPT, setup, _GPU, tensors)
    last = rw.append(new(h2d_op.evolve(host_waits=facts.gpu_param_width == 4), [adam]))
    if facts.gpu_param_width < 4:
        rw.append(new(cast.evolve(name="params.cast_bf16", host_waits=True), [last]))
