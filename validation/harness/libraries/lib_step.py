"""One training-step case run the way a library runs it (issue 14, part 1).

    python3 validation/harness/libraries/lib_step.py --spec '<json>' --out DIR

Spec keys: name, mode (ds | fsdp2 | plain), model (8b | 3b | 1b | tiny), mb, seq,
ckpt (bool), ds (DeepSpeed zero_optimization section, for mode ds), impl
(plain: foreach | fused; fsdp2: default | foreach | fused), warmup, steps.

Model: Hugging Face LlamaForCausalLM from a LlamaConfig (random weights, no
download), sdpa attention, embeddings tied or not as the HF config of that shape has them.
Step = forward with labels (HF loss) + backward + optimizer step (+ zero_grad),
then torch.cuda.synchronize(); time with time.perf_counter; median of `steps`
after `warmup` warm-up steps; then one step under torch.profiler (CPU + CUDA).

Writes DIR/<name>.json (results, effective config) and DIR/<name>.trace.json.gz.

FSDP2 on several GPUs: run under torchrun (`torchrun --nproc_per_node N lib_step.py ...`); each rank takes
its GPU from LOCAL_RANK and its own random tokens, rank 0 writes <name>.json and the trace, rank r > 0
writes <name>.rank<r>.json (its own host and HBM figures). torchrun sets OMP_NUM_THREADS=1 unless told
otherwise, so the ranks' CPU optimizers run as users' torchrun jobs run them.

DeepSpeed on several GPUs: run under DeepSpeed's own launcher (`deepspeed --num_gpus N lib_step.py ...`, i.e.
deepspeed.launcher.runner -> deepspeed.launcher.launch), which passes --local_rank and sets RANK/LOCAL_RANK/
WORLD_SIZE but leaves OMP_NUM_THREADS unset (launch.py sets it only with --bind_cores_to_rank); the engine
initialises torch.distributed itself. Each rank records the OpenMP threads every loaded OpenMP runtime
offers (torch's and the one DeepSpeedCPUAdam's JIT-built op links) and its CPU time over the timed steps.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback

MODELS = {
    # Llama-3.2-3B / -1B shapes (HF config.json): tied embeddings, vocab 128256, rope_theta 500000
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8),
    # Llama-3.1-8B (HF config.json): untied embeddings (a separate lm_head), llama3 rope scaling
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "tiny": dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=4),
}


def proc_status(pid="self", fields=("VmHWM", "VmRSS", "VmLck", "VmPin")):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in fields:
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def openmp_threads() -> list:
    """omp_get_max_threads() of every OpenMP runtime loaded in this process, by library path: torch's
    bundled libgomp and the system libgomp that a JIT-built -fopenmp op (DeepSpeedCPUAdam) links may differ."""
    import ctypes
    out, seen = [], set()
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split()[-1] for ln in f if "omp" in ln.rsplit("/", 1)[-1] and ".so" in ln}
    except OSError:
        return out
    for path in sorted(paths):
        if path in seen:
            continue
        seen.add(path)
        try:
            out.append({"lib": path, "omp_get_max_threads": ctypes.CDLL(path).omp_get_max_threads()})
        except (OSError, AttributeError) as e:
            out.append({"lib": path, "error": repr(e)[:200]})
    try:
        with open("/proc/self/maps") as f:
            ops = sorted({ln.split()[-1] for ln in f if "cpu_adam" in ln})
        links = [subprocess.run(["ldd", op], capture_output=True, text=True).stdout for op in ops]
        out.append({"ops": ops, "ops_openmp": [ln.strip() for t in links for ln in t.splitlines() if "omp" in ln]})
    except OSError:
        pass
    return out


def run_child(script, name, timeout):
    """Runs `script --child name` in a fresh process; its last 'RESULT <json>' line, else the error."""
    p = subprocess.run([sys.executable, os.path.abspath(script), "--child", name], capture_output=True, text=True,
                       timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else {"error": (p.stderr or p.stdout)[-3000:]}


def build_model(spec, torch, dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM
    shape = dict(MODELS[spec["model"]])
    tie = shape.pop("tie_word_embeddings", True)  # the Llama-3.2 configs tie; Llama-3.1-8B does not
    cfg = LlamaConfig(vocab_size=128256, max_position_embeddings=max(spec["seq"], 2048), rope_theta=500000.0,
                      tie_word_embeddings=tie, use_cache=False, attn_implementation="sdpa", **shape)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(prev)
    model.config.use_cache = False
    if spec.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--local_rank", type=int, default=None)  # passed by DeepSpeed's launcher (also in LOCAL_RANK)
    a = ap.parse_args()
    spec = json.loads(a.spec)
    os.makedirs(a.out, exist_ok=True)
    res = {"name": spec["name"], "spec": spec, "ok": False}
    rank = int(os.environ.get("RANK", "0"))
    jpath = os.path.join(a.out, spec["name"] + (f".rank{rank}" if rank else "") + ".json")
    try:
        run(spec, res, a.out)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        res["traceback"] = traceback.format_exc()[-4000:]
        print(res["traceback"], flush=True)
    finally:
        res["host"] = proc_status()
        res["ru_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(jpath, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(json.dumps({k: res.get(k) for k in ("name", "ok", "step_time_s", "peak_allocated_bytes",
                                                   "error")}, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # do not wait for DeepSpeed/SuperOffload worker teardown


def run(spec, res, outdir):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    world = int(os.environ.get("WORLD_SIZE", "1"))  # > 1 under torchrun (fsdp2) or deepspeed's launcher (ds)
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    res["torch"] = torch.__version__
    res["cuda"] = torch.version.cuda
    res["gpu"] = torch.cuda.get_device_name(dev)
    res["world_size"], res["rank"] = world, rank
    res["cpu_count"] = os.cpu_count()
    res["affinity"] = len(os.sched_getaffinity(0))
    res["torch_threads_at_start"] = torch.get_num_threads()
    import transformers
    res["transformers"] = transformers.__version__
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if world == 1:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    elif spec["mode"] not in ("fsdp2", "ds"):
        raise ValueError("several ranks: fsdp2 (torchrun) or ds (deepspeed launcher) only")
    res["launch_env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "LOCAL_RANK", "LOCAL_SIZE",
                                                        "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES")}
    mb, seq = spec["mb"], spec["seq"]
    mode = spec["mode"]
    g = torch.Generator(device=dev).manual_seed(rank)
    ids = torch.randint(0, 128256, (mb, seq), device=dev, generator=g)
    t_init = time.perf_counter()

    if mode == "ds":
        import deepspeed
        res["deepspeed"] = deepspeed.__version__
        model, cfg = build_model(spec, torch, torch.bfloat16, dev)
        ds_config = {
            "train_micro_batch_size_per_gpu": mb,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                      "weight_decay": 0.1}},
            "zero_optimization": spec["ds"],
            "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False,
        }
        res["ds_config"] = ds_config
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                 config=ds_config)
        res["ds_optimizer"] = type(opt).__name__
        inner = getattr(opt, "optimizer", None)
        res["ds_inner_optimizer"] = type(inner).__name__ if inner is not None else None
        try:
            res["ds_zero_config_effective"] = json.loads(engine._config.zero_config.model_dump_json())
        except Exception as e:  # noqa: BLE001
            res["ds_zero_config_effective"] = repr(e)

        def step():
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            return loss
    elif mode == "fsdp2":
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        # several ranks: clip_grad_norm_ all-reduces the CPU DTensors' norm, which needs a CPU backend
        # (torchtitan initialises "cuda:nccl,cpu:gloo" under CPU offload for the same reason)
        backend = "cuda:nccl,cpu:gloo" if world > 1 else "nccl"
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=dev)
        model, cfg = build_model(spec, torch, torch.float32, dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=spec.get("pin", True))
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        torch.cuda.empty_cache()
        kw = {}
        if spec.get("impl") in ("foreach", "fused"):
            kw[spec["impl"]] = True
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **kw)
        res["fsdp2"] = {"mp_policy": "param bf16, reduce fp32", "offload_policy": repr(off),
                        "optimizer_kwargs": kw, "param_device": str(next(model.parameters()).device),
                        "param_dtype": str(next(model.parameters()).dtype)}

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    elif mode == "plain":
        # bf16 weights on the GPU, fp32 master weights + AdamW on the CPU (pinned)
        model, cfg = build_model(spec, torch, torch.bfloat16, dev)
        params = [p for p in model.parameters() if p.requires_grad]
        masters = []
        for p in params:
            m = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
            m.copy_(p.detach())
            m.grad = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
            masters.append(m)
        impl = spec.get("impl", "foreach")
        opt = torch.optim.AdamW(masters, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **{impl: True})
        res["plain"] = {"gpu_params": "bf16", "master": "fp32 pinned CPU", "optimizer": f"AdamW({impl}=True) on CPU",
                        "grad_path": "per-tensor bf16 GPU grad -> fp32 pinned CPU .copy_(non_blocking)",
                        "param_path": "per-tensor fp32 pinned CPU -> bf16 GPU .copy_(non_blocking)"}

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            for p, m in zip(params, masters):
                m.grad.copy_(p.grad, non_blocking=True)
            torch.cuda.synchronize()
            for p in params:
                p.grad = None
            opt.step()
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m, non_blocking=True)
            return loss
    else:
        raise ValueError(mode)

    res["n_params"] = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
    res["init_s"] = time.perf_counter() - t_init
    res["torch_threads"] = torch.get_num_threads()
    res["openmp_after_init"] = openmp_threads()
    res["affinity_after_init"] = len(os.sched_getaffinity(0))
    res["mem_after_init"] = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                             "host": proc_status()}
    torch.cuda.reset_peak_memory_stats()
    times, losses, cpu_s = [], [], 0.0
    for i in range(spec.get("warmup", 3) + spec.get("steps", 5)):
        torch.cuda.synchronize()
        c0 = os.times()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        c1 = os.times()
        losses.append(float(loss.detach()))
        if i >= spec.get("warmup", 3):
            times.append(dt)
            cpu_s += (c1.user - c0.user) + (c1.system - c0.system)
        print(f"  step {i} {dt:.3f}s loss {losses[-1]:.3f}", flush=True)
    res["step_times_s"] = times
    res["step_time_s"] = statistics.median(times)
    res["losses"] = losses
    res["process_cpu_s_per_timed_step"] = cpu_s / len(times)  # user + system, all threads of this rank
    res["openmp_after_steps"] = openmp_threads()
    res["threads_after_steps"] = len(os.listdir("/proc/self/task"))
    res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    res["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    res["tokens_per_s"] = mb * seq / res["step_time_s"]
    try:
        res["host_memory_stats"] = {k: v for k, v in torch.cuda.host_memory_stats().items()
                                    if k.startswith(("allocated_bytes.current", "allocated_bytes.peak",
                                                     "reserved_bytes.current", "reserved_bytes.peak",
                                                     "allocations.current"))}
    except Exception as e:  # noqa: BLE001
        res["host_memory_stats"] = repr(e)
    res["host_after_steps"] = proc_status()
    try:
        import psutil
        kids = psutil.Process().children(recursive=True)
        res["children"] = [{"pid": k.pid, "cmd": " ".join(k.cmdline()[:3])[:200], **proc_status(k.pid)}
                           for k in kids]
    except Exception as e:  # noqa: BLE001
        res["children"] = repr(e)
    partial = os.path.join(outdir, spec["name"] + (f".rank{rank}" if rank else "") + ".json.partial")
    with open(partial, "w") as f:
        json.dump(res, f, default=str)
    # profile only if the step and the trace export fit before the batch's deadline
    deadline = spec.get("deadline")
    fits = torch.tensor([0 if deadline and time.time() + 3 * max(times) + 40 > deadline else 1], device=dev)
    if world > 1:  # every rank must take the same decision: the profiled step has collectives
        import torch.distributed as dist
        dist.all_reduce(fits, op=dist.ReduceOp.MIN)
    if not int(fits.item()):
        res["note"] = "profiled step skipped: the call's time budget"
        spec = dict(spec, profile=False)
    if spec.get("profile", True):
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            res["profiled_step_s"] = time.perf_counter() - t0
        tmp = f"/tmp/{spec['name']}.trace.json"
        if rank:  # every rank ran the profiled step (its collectives); rank 0's trace is kept
            os.remove(partial)
            return
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as fi, gzip.open(os.path.join(outdir, spec["name"] + ".trace.json.gz"), "wb",
                                              compresslevel=6) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(tmp)
        res["trace"] = spec["name"] + ".trace.json.gz"
    os.remove(partial)


if __name__ == "__main__":
    main()
