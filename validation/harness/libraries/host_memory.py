"""Host-memory microbenchmarks for issue 14, session 5 (nothing from the measured library cases):
what each piece of an offload run holds in host memory, each in a fresh process, read from
/proc (VmHWM reset with `echo 5 > /proc/PID/clear_refs` before the part measured).

* adam_temps: torch.optim.AdamW foreach / for-loop / fused on fp32 CPU tensors (a 16 x 16M list
  and the Llama-3.2-1B tensor list): the peak of one step above params + grads + moments.
* cast_temp: a blocking copy_ of an fp32 CPU tensor (pageable, pinned) into a bf16 GPU tensor
  (DeepSpeed ZeRO-3's parameter return): the host memory the copy holds while it runs.
* superoffload: DeepSpeed 0.19.8's SuperOffloadCPUOptimizer alone, one sub-group of 2.5e8 / 1e9
  parameters stepped twice the way superoffload_stage3.py does it (pageable fp32 partition, pinned
  fp32 gradient): both processes' VmHWM / RssAnon / RssShmem sampled every 5 ms, and the node's
  MemAvailable, so that shared pages counted in both processes show.
* ds_engine: a 2-layer Hugging Face Llama (hidden 256) trained 3 steps under deepspeed.initialize
  (ZeRO-2 without offload and a client fused AdamW; ZeRO-2 + offload_optimizer; ZeRO-3 +
  super_offload): what DeepSpeed's engine adds to a training process's own host memory.
* ds_pinned: a Llama-shaped model (hidden 1536, 8 layers, 2.5e8 parameters) under ZeRO-3 +
  offload_optimizer, with and without offload_param: every pinned buffer DeepSpeed asks for
  (get_accelerator().pin_memory / pin_empty wrapped: elements, dtype, caller), torch's host
  allocator statistics, VmHWM and the HBM peak.

    python3 validation/harness/libraries/host_memory.py --out $OUT/host_memory.json [--only a,b]

Ran once, 2026-11-27, lent nvidia-h100-x1 (16 vCPUs, torch 2.11.0+cu130, DeepSpeed 0.19.8 pure-Python
wheel with DeepSpeedCPUAdam JIT-built first), as committed in d97081a; the last child
(ds_engine_z3_superoffload) did not finish inside the call's limit. Its /proc reader is since
lib_step.proc_status (the same reads).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib_step import proc_status, run_child  # noqa: E402 (the same folder)

FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPin", "VmLck")
UNIFORM = [16 * 2 ** 20] * 16


def status(pid="self"):
    return proc_status(pid, FIELDS)


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("MemAvailable", "Shmem", "MemFree"):
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_hwm(pid="self"):
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --- children ---------------------------------------------------------------------------------
def adam_temps(impl, list_name):
    import torch
    from offload_calibration import llama_shapes
    sizes = UNIFORM if list_name == "uniform16M" else llama_shapes("1b")
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.empty(n).uniform_(-1, 1))
        p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
        params.append(p)
    kw = {"foreach": {"foreach": True}, "forloop": {"foreach": False}, "fused": {"fused": True}}[impl]
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    total = sum(sizes)
    s0 = status()
    reset_hwm()
    t = time.perf_counter()
    opt.step()  # creates exp_avg / exp_avg_sq (8 B per parameter) and runs once
    step1 = time.perf_counter() - t
    s1 = status()
    reset_hwm()
    s2a = status()
    t = time.perf_counter()
    opt.step()
    step2 = time.perf_counter() - t
    s2 = status()
    return {"impl": impl, "list": list_name, "tensors": len(sizes), "params": total, "largest": max(sizes),
            "threads": torch.get_num_threads(), "before": s0, "after_step1": s1, "before_step2": s2a,
            "after_step2": s2, "step1_s": step1, "step2_s": step2,
            # the step's peak above what it holds all along (params, grads and both moments, 16 B each)
            "step2_peak_over_states": s2["VmHWM"] - (s0["VmRSS"] + 8 * total),
            "step1_peak_over_states": s1["VmHWM"] - (s0["VmRSS"] + 8 * total),
            "retained_after_step1": s1["VmRSS"] - (s0["VmRSS"] + 8 * total)}


def cast_temp():
    import torch
    torch.zeros(1, device="cuda")
    rows = []
    for n, pinned in ((int(2.5e8), False), (int(1e9), False), (int(2.5e8), True)):
        src = torch.empty(n).uniform_(-1, 1)
        if pinned:
            src = src.pin_memory()
        dst = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        dst.copy_(src)
        torch.cuda.synchronize()
        a = status()
        reset_hwm()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        b = status()
        rows.append({"numel": n, "pinned_src": pinned, "before": a, "after": b, "s": dt,
                     "peak_over_before": b["VmHWM"] - a["VmRSS"]})
        del src, dst
    return rows


class Sampler(threading.Thread):
    """Polls the processes' /proc status and the node's meminfo every 5 ms; keeps each field's
    maximum and, for each process, the fields at its largest VmRSS."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.stop, self.max, self.at_peak, self.min_avail, self.max_shmem = pids, False, {}, {}, None, 0

    def run(self):
        while not self.stop:
            for name, pid in self.pids.items():
                s = status(pid)
                m = self.max.setdefault(name, {})
                for k, v in s.items():
                    m[k] = max(m.get(k, 0), v)
                if s.get("VmRSS", 0) >= self.at_peak.get(name, {}).get("VmRSS", -1):
                    self.at_peak[name] = s
            mi = meminfo()
            self.min_avail = mi["MemAvailable"] if self.min_avail is None else min(self.min_avail, mi["MemAvailable"])
            self.max_shmem = max(self.max_shmem, mi["Shmem"])
            time.sleep(0.005)


def superoffload(numel):
    import torch
    torch.zeros(1, device="cuda")  # the training process has its CUDA context
    from deepspeed.runtime.superoffload.superoffload_utils import SuperOffloadCPUOptimizer
    numel = int(numel)
    node0 = meminfo()
    main0 = status()
    # DeepSpeed's fp32 partition (pageable, stage3.py _create_fp32_partitions) and its fp32 gradient
    # buffer (pinned, stage3.py: subgroup_gradient_buffer pin_memory)
    flat = torch.empty(numel).uniform_(-1, 1)
    grad = torch.empty(numel, pin_memory=True).uniform_(-1e-3, 1e-3)
    node1, main1 = meminfo(), status()
    cfg = [{"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False}]
    so = SuperOffloadCPUOptimizer(cfg, cpuadam_cores_perc=0.8, max_grad_numel=numel, pin_memory=True)
    wpid = so.cpuadam_process.pid
    # a one-element task: returns once the worker has built its optimizer and its gradient buffer
    tiny_p, tiny_g = torch.zeros(1), torch.zeros(1)
    so.async_step(0, 99, tiny_p, tiny_g, lr=1e-5)
    while so.get_result() is None:
        time.sleep(0.01)
    time.sleep(0.5)
    worker_idle, node_idle, main_idle = status(wpid), meminfo(), status()
    reset_hwm(wpid)
    reset_hwm()
    sampler = Sampler({"main": "self", "worker": wpid})
    sampler.start()
    steps = []
    for _ in range(2):
        t = time.perf_counter()
        so.async_step(0, 0, flat.data, grad.data, lr=1e-5)
        while True:
            res = so.get_result(expected_event_type="adam_step")
            if res is not None:
                break
            time.sleep(0.001)
        flat.data.copy_(res["updated_param"], non_blocking=True)  # superoffload_stage3.py
        del res
        steps.append(time.perf_counter() - t)
        time.sleep(0.3)
    sampler.stop = True
    sampler.join()
    out = {"numel": numel, "steps_s": steps, "node_before": node0, "main_before": main0,
           "node_with_tensors": node1, "main_with_tensors": main1, "worker_idle": worker_idle,
           "node_idle": node_idle, "main_idle": main_idle, "worker_after": status(wpid), "main_after": status(),
           "node_after": meminfo(), "sampled_max": sampler.max, "sampled_at_rss_peak": sampler.at_peak,
           "node_min_available": sampler.min_avail, "node_max_shmem": sampler.max_shmem,
           "flat_pinned_after": flat.is_pinned(), "grad_pinned_after": grad.is_pinned(),
           "flat_shared_after": flat.is_shared(), "grad_shared_after": grad.is_shared()}
    so.close()
    return out


def _llama(torch, hidden, inter, layers, heads, kv, vocab, ckpt):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=True, use_cache=False,
                      attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _ds_run(zero, client_optimizer, model_kw, steps, seq, mb, log_pins):
    import torch
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    pins = []
    if log_pins:
        import traceback
        acc = get_accelerator()
        orig_pin, orig_empty = acc.pin_memory, getattr(acc, "pin_empty", None)

        def where():
            frames = [f for f in traceback.extract_stack()[:-2] if "deepspeed" in f.filename]
            return [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-3:]]

        def pin_memory(tensor, *a, **k):
            pins.append({"numel": tensor.numel(), "dtype": str(tensor.dtype), "at": where()})
            return orig_pin(tensor, *a, **k)
        acc.pin_memory = pin_memory
        if orig_empty is not None:
            def pin_empty(*a, **k):
                t = orig_empty(*a, **k)
                pins.append({"numel": t.numel(), "dtype": str(t.dtype), "at": where(), "pin_empty": True})
                return t
            acc.pin_empty = pin_empty
    base = status()
    model = _llama(torch, **model_kw)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
           "bf16": {"enabled": True}, "zero_optimization": zero, "steps_per_print": 10 ** 9,
           "zero_allow_untested_optimizer": True}
    if client_optimizer:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    else:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.1}}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    after_init = {"host": status(), "hbm_allocated": torch.cuda.memory_allocated(),
                  "host_alloc": {k: v for k, v in torch.cuda.host_memory_stats().items()
                                 if k.startswith(("allocated_bytes", "reserved_bytes", "allocations"))}}
    torch.cuda.reset_peak_memory_stats()
    vocab = model_kw["vocab"]
    ids = torch.randint(0, vocab, (mb, seq), device="cuda")
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    import psutil
    kids = [{"pid": k.pid, **status(k.pid)} for k in psutil.Process().children(recursive=True)]
    return {"zero": zero, "client_optimizer": client_optimizer, "model": model_kw, "n_params": n_params,
            "seq": seq, "mb": mb, "base": base, "after_init": after_init, "after_steps": status(),
            "host_alloc": {k: v for k, v in torch.cuda.host_memory_stats().items()
                           if k.startswith(("allocated_bytes", "reserved_bytes", "allocations"))},
            "hbm_peak": torch.cuda.max_memory_allocated(), "steps_s": times, "children": kids,
            "optimizer": type(engine.optimizer).__name__, "pins": pins}


TINY = dict(hidden=256, inter=512, layers=2, heads=4, kv=2, vocab=1024, ckpt=False)
MID = dict(hidden=1536, inter=4096, layers=8, heads=12, kv=4, vocab=32000, ckpt=True)
CPU_OFF = {"device": "cpu", "pin_memory": True}
CHILDREN = {  # in the order they run: the most wanted first
    "superoffload_2.5e8": (superoffload, (2.5e8,)),
    "superoffload_1e9": (superoffload, (1e9,)),
    **{f"adam_{impl}_{lst}": (adam_temps, (impl, lst)) for lst in ("llama1b", "uniform16M")
       for impl in ("foreach", "forloop", "fused")},
    "cast_temp": (cast_temp, ()),
    "ds_pinned_z3_offparam": (_ds_run, ({"stage": 3, "offload_optimizer": CPU_OFF, "offload_param": CPU_OFF}, False,
                                        MID, 2, 1024, 2, True)),
    "ds_pinned_z3_offopt": (_ds_run, ({"stage": 3, "offload_optimizer": CPU_OFF}, False, MID, 2, 1024, 2, True)),
    "ds_engine_z2": (_ds_run, ({"stage": 2}, True, TINY, 3, 256, 2, False)),
    "ds_engine_z2_offopt": (_ds_run, ({"stage": 2, "offload_optimizer": CPU_OFF}, False, TINY, 3, 256, 2, False)),
    "ds_engine_z3_superoffload": (_ds_run, ({"stage": 3, "offload_optimizer": {**CPU_OFF, "super_offload": True}},
                                            False, TINY, 3, 256, 2, False)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--only", default="")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        fn, args = CHILDREN[a.child]
        print("RESULT " + json.dumps(fn(*args), default=str), flush=True)
        os._exit(0)  # do not wait for DeepSpeed's worker teardown
    names = [n for n in CHILDREN if not a.only or any(n.startswith(p) for p in a.only.split(","))]
    results = {}
    for name in names:
        t = time.time()
        results[name] = run_child(__file__, name, 240)
        print(f"{name}: {time.time() - t:.0f}s {results[name].get('error', 'ok')[-500:]}", flush=True)
        with open(a.out, "w") as f:  # after every child: what finished comes back even if the call is cut short
            json.dump({"results": results, "meta": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0]}},
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
