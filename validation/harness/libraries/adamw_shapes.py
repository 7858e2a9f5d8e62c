"""torch's CPU AdamW and clip_grad_norm_ on one FSDP2 rank's shards, by tensor shape and thread count
(issue 14 microbenchmark, session 6).

    python3 validation/harness/libraries/adamw_shapes.py OUT_DIR            # world size 1, then 2
    (world size 2 runs itself under torchrun --nproc_per_node 2, as the FSDP2 cases did)

FSDP2 + CPUOffloadPolicy leaves each parameter and its gradient as a CPU DTensor sharded Shard(0)
over the ranks; torch.optim.AdamW() with default flags steps them one tensor at a time (the
for-loop: torch/optim/adam.py _single_tensor_adam), and clip_grad_norm_ runs _foreach_norm and
_foreach_mul_ over them. Under torchrun with several ranks OMP_NUM_THREADS=1, so each rank's
for-loop runs one thread. This times, for every distinct per-rank shard shape of the
Llama-3.2-1B and -3B shapes (HF parameter order; rows / world size), a list of k such tensors
(k x elements ~ 64M, one tensor for an embedding): the for-loop AdamW on DTensors and on plain
tensors, at 1, 4 and 16 threads (16 = torch's default here) at world size 1 and at torchrun's
default (1 thread) at world size 2 with both ranks stepping at once; fused and foreach AdamW at
three shapes; clip_grad_norm_ (foreach None = the foreach path, and False) and get_total_norm
alone. A check, not for calibration: one rank's whole 1B list at world size 2. Each timed step
records ru_minflt (the fresh temporaries' page faults). 1 warm-up step (it also creates the
optimizer state), then 2 timed (1 for an embedding); the median.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from lib_step import MODELS  # noqa: E402 (this folder is the script's sys.path[0]): the cases' shapes

VOCAB = 128256  # Llama-3.2's, as lib_step.build_model sets it
TARGET_ELEMENTS = 64 << 20


def shard_shapes(model: str, ws: int) -> list[tuple[int, ...]]:
    """One rank's local shard shapes in model.parameters() order (tied embedding, HF Llama)."""
    c = MODELS[model]
    h, i = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    full = [(VOCAB, h)] + layer * c["num_hidden_layers"] + [(h,)]
    return [(s[0] // ws,) + s[1:] for s in full]


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def distinct(shapes):
    seen = []
    for s in shapes:
        if s not in seen:
            seen.append(s)
    return seen


def make_params(shapes, kind, mesh, ws):
    import torch
    from torch.distributed.tensor import DTensor, Shard

    def wrap(t):
        if kind != "dtensor":
            return t
        g = (t.shape[0] * ws,) + tuple(t.shape[1:])
        stride = tuple(numel(g[j + 1:]) for j in range(len(g)))
        return DTensor.from_local(t, mesh, [Shard(0)], run_check=False, shape=torch.Size(g), stride=stride)

    params = []
    for s in shapes:
        p = torch.nn.Parameter(wrap(torch.empty(s).uniform_(-0.02, 0.02)))
        p.grad = wrap(torch.empty(s).uniform_(-1e-3, 1e-3))
        params.append(p)
    return params


def timed(fn, warm, steps, barrier):
    out = []
    for k in range(warm + steps):
        barrier()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        if k >= warm:
            out.append((t, f))
    return statistics.median(t for t, _ in out), statistics.median(f for _, f in out), [t for t, _ in out]


def run_rows(rank, ws, mesh, plan, barrier, emit):
    import torch
    for threads, model, impl, kinds, clip in plan:
        torch.set_num_threads(threads)
        shapes = distinct(shard_shapes(model, ws)) if isinstance(model, str) else model
        for shape in shapes:
            n = numel(shape)
            k = max(1, min(64, TARGET_ELEMENTS // n))
            for kind in kinds:
                try:
                    one_list(rank, ws, mesh, threads, impl, kind, shape, n, k, clip, barrier, emit)
                except Exception as e:  # noqa: BLE001 - recorded, and the batch goes on (ranks fail alike)
                    emit(dict(what="error", impl=impl, kind=kind, ws=ws, threads=threads, shape=list(shape),
                              error=repr(e)[:300]))


def one_list(rank, ws, mesh, threads, impl, kind, shape, n, k, clip, barrier, emit):
    import torch
    torch.set_num_threads(16 if ws == 1 else threads)  # fast init; the step runs at `threads`
    params = make_params([shape] * k, kind, mesh, ws)
    torch.set_num_threads(threads)
    kw = {"fused": True} if impl == "fused" else {"foreach": True} if impl == "foreach" else {}
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    big = n * k >= (200 << 20)
    s, faults, runs = timed(opt.step, 1, 1 if big else 2, barrier)
    row = dict(what="adamw", impl=impl, kind=kind, ws=ws, rank=rank, threads=torch.get_num_threads(),
               shape=list(shape), elements=n, tensors=k, step_s=s, runs_s=runs, minflt=faults,
               s_per_tensor=s / k, ns_per_element=s / (n * k) * 1e9)
    emit(row)
    if clip:
        for fe in (None, False):
            grads = [p.grad for p in params]

            def norm_only():
                t = torch.nn.utils.get_total_norm(grads, foreach=fe)
                if hasattr(t, "full_tensor"):
                    t.full_tensor()
            s1, _, r1 = timed(norm_only, 1, 2, barrier)
            s2, _, r2 = timed(lambda: torch.nn.utils.clip_grad_norm_(params, 1e30, foreach=fe), 1, 2,
                              barrier)
            emit(dict(what="clip", foreach=fe, kind=kind, ws=ws, rank=rank, threads=torch.get_num_threads(),
                      shape=list(shape), elements=n, tensors=k, norm_s=s1, clip_grad_norm_s=s2,
                      norm_gb_per_s=4 * n * k / s1 / 1e9, mul_s=s2 - s1, runs_norm_s=r1, runs_clip_s=r2))
    del opt, params


def whole_list(rank, ws, mesh, barrier, emit):
    """One rank's whole 1B list (check): clip_grad_norm_ then the for-loop AdamW, as the FSDP2 case."""
    import torch
    params = make_params(shard_shapes("1b", ws), "dtensor", mesh, ws)
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)
    s2, _, r2 = timed(lambda: torch.nn.utils.clip_grad_norm_(params, 1e30), 1, 1, barrier)
    s, faults, runs = timed(opt.step, 1, 1, barrier)
    emit(dict(what="whole_1b", ws=ws, rank=rank, threads=torch.get_num_threads(), tensors=len(params),
              elements=sum(p.numel() for p in params), adamw_s=s, adamw_runs_s=runs, minflt=faults,
              clip_grad_norm_s=s2))


def host_facts():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout
        except Exception as e:  # noqa: BLE001 - a fact we could not read is recorded as such
            return f"unavailable: {e}"
    import torch
    return {"lscpu": sh("lscpu"), "glibc": platform.libc_ver(), "thp": sh("cat /sys/kernel/mm/transparent_hugepage/enabled"),
            "torch": torch.__version__, "default_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    out_dir = sys.argv[1]
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    facts = host_facts()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,))
    barrier = dist.barrier if ws > 1 else (lambda: None)
    rows = []
    log = open(os.path.join(out_dir, f"adamw_shapes_ws{ws}_rank{rank}.jsonl"), "w")

    def emit(row):
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        if rank == 0:
            print(json.dumps({k: v for k, v in row.items() if k not in ("runs_s",)}), flush=True)

    default = torch.get_num_threads()
    fl, dt_pl = "forloop", ("dtensor", "plain")
    if ws == 1:
        plan = [(1, "1b", fl, dt_pl, True), (1, "3b", fl, dt_pl, False),
                (16, "1b", fl, dt_pl, True), (16, "3b", fl, dt_pl, False),
                (4, [(2048,), (2048, 2048), (8192, 2048)], fl, ("dtensor",), False)]
        for t in (1, 16):
            for impl in ("fused", "foreach"):
                plan.append((t, [(2048,), (2048, 2048), (8192, 2048)], impl, dt_pl, False))
        # ADAMW_SHAPES_FROM=4: resume after the first four rows of the plan (the first call's)
        plan = plan[int(os.environ.get("ADAMW_SHAPES_FROM", "0")):]
    else:
        plan = [(default, "1b", fl, dt_pl, True), (default, "3b", fl, ("dtensor",), False)]
    t0 = time.perf_counter()
    run_rows(rank, ws, mesh, plan, barrier, emit)
    if ws > 1:
        torch.set_num_threads(default)
        whole_list(rank, ws, mesh, barrier, emit)
    with open(os.path.join(out_dir, f"adamw_shapes_ws{ws}_rank{rank}.json"), "w") as f:
        json.dump({"method": __doc__, "host": facts, "world_size": ws, "rank": rank,
                   "wall_s": time.perf_counter() - t0, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    if ws == 1 and not os.environ.get("ADAMW_SHAPES_NO_WS2"):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MASTER_PORT")}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", "29733", __file__, out_dir], env=env, check=True)


if __name__ == "__main__":
    main()
