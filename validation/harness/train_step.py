"""Run one training-step configuration and write validation/cases/<name>/.

    python3 validation/harness/train_step.py --spec '{"name": ..., "model": {...}, ...}'
    torchrun --nproc_per_node 2 validation/harness/train_step.py --spec spec.json
    python3 validation/harness/train_step.py --spec ... --tiny     # CPU smoke test

Spec keys (defaults in DEFAULTS): name, description, hardware, model (ModelConfig
fields), precision (fp32|tf32|bf16|fp8), recompute (none|selective|full),
micro_batch, seq, lora_rank, offload (list), zero, framework, optimizer_impl,
mode (single|ddp|fsdp), fsdp_cpu_offload, warmup, steps, fp8_backward.

Step = zero_grad(set_to_none=True), forward (loss), loss.backward(),
optimizer.step() (plus the explicit copies of the optimizer-offload plan),
then torch.cuda.synchronize(); step time is host wall time (perf_counter)
around that, median of `steps` timed steps after `warmup` warm-up steps.

Plans:
* torch-amp (default): fp32 parameters, torch.autocast(bfloat16) for bf16/fp8.
  fp32: allow_tf32=False for matmul and cuDNN; tf32: allow_tf32=True.
* optimizer offload (offload=["optimizer","grads"]), ZeRO-Offload-like, done
  explicitly: GPU keeps fp32 params (autocast as above) and fp32 grads; after
  backward every grad is copied (non_blocking) into a flat pinned fp32 CPU
  buffer, the CPU runs torch.optim.AdamW (fused=True on CPU when available,
  else foreach) on fp32 master params that are views of a flat pinned buffer,
  then the updated params are copied back to the GPU (non_blocking) and the
  step synchronizes.  No overlap of copies with compute.
* activation offload (offload=["activations"]): forward under
  torch.autograd.graph.save_on_cpu(pin_memory=True): every tensor autograd
  saves goes to pinned host memory and comes back in backward.
* fsdp (mode="fsdp"): torch.distributed.fsdp.FullyShardedDataParallel, one unit
  per decoder layer (transformer_auto_wrap_policy) plus the root,
  MixedPrecision(param/reduce/buffer dtype bf16), FULL_SHARD (zero=3) or
  SHARD_GRAD_OP (zero=2), optionally CPUOffload(offload_params=True) (then the
  optimizer runs on CPU on the fp32 flat params: AdamW fused CPU when available).
* ddp (mode="ddp"): DistributedDataParallel over fp32 params with bf16 autocast,
  fp32 gradient all-reduce in 25 MB buckets (default).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import DecoderLayer, ModelConfig, build_model, fp8_selfcheck, gqa_supported  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

DEFAULTS = dict(
    name="case", description="", hardware=None, precision="bf16", recompute="none",
    micro_batch=1, seq=2048, lora_rank=0, offload=[], zero=0, framework="torch-amp",
    optimizer_impl="foreach", mode="single", fsdp_cpu_offload=False, warmup=3, steps=8,
    fp8_backward=True, profile_active=2,
)


# ----------------------------------------------------------------------------- helpers
def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def toml_dump(tables: dict) -> str:
    out = []
    for tname, t in tables.items():
        out.append(f"[{tname}]")
        for k, v in t.items():
            key = k if k.replace("_", "").isalnum() else json.dumps(k)
            out.append(f"{key} = {toml_value(v)}")
        out.append("")
    return "\n".join(out)


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


def software_string():
    drv = sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1")
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, driver {drv or 'n/a'}"


def hardware_name(gpu: str) -> str:
    g = gpu.upper()
    if "H200" in g:
        return "h200-sxm" if "NVL" not in g else "h200-nvl"
    if "H100" in g:
        return "h100-pcie" if "PCIE" in g else "h100-sxm"
    if "GH200" in g:
        return "gh200-96gb"
    return "cpu"


def kernel_utilization(trace_path: Path) -> dict:
    """Union of GPU kernel intervals / wall between first and last ProfilerStep."""
    op = gzip.open if str(trace_path).endswith(".gz") else open
    with op(trace_path, "rt") as f:
        tr = json.load(f)
    ev = tr["traceEvents"] if isinstance(tr, dict) else tr
    steps = [e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        return {}
    t0 = min(e["ts"] for e in steps)
    t1 = max(e["ts"] + e["dur"] for e in steps)

    def union(events):
        iv = sorted((max(e["ts"], t0), min(e["ts"] + e["dur"], t1)) for e in events)
        tot, cs, ce = 0.0, None, None
        for s, e in iv:
            if e <= s:
                continue
            if cs is None:
                cs, ce = s, e
            elif s <= ce:
                ce = max(ce, e)
            else:
                tot += ce - cs
                cs, ce = s, e
        if cs is not None:
            tot += ce - cs
        return tot

    kern = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel"]
    mem = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    nonccl = [e for e in kern if "nccl" not in str(e.get("name", "")).lower()]
    wall = t1 - t0
    return {
        "profiled_steps": len(steps),
        "profiled_wall_s": wall * 1e-6,
        "kernel_union_s": union(kern) * 1e-6,
        "gpu_utilization_kernels": union(kern) / wall if wall else 0.0,
        "gpu_utilization_kernels_no_nccl": union(nonccl) / wall if wall else 0.0,
        "gpu_utilization_kernels_and_memcpy": union(kern + mem) / wall if wall else 0.0,
        "n_kernels": len(kern),
        "n_memcpy": len(mem),
        "memcpy_bytes_by_name": _memcpy_bytes(mem),
    }


def slim_trace(path: Path):
    """Drop flow (arrow) events (cat ac2g / fwdbwd, ph s/f) to keep traces small; rewrite gzip."""
    with gzip.open(path, "rt") as f:
        tr = json.load(f)
    ev = tr["traceEvents"]
    tr["traceEvents"] = [e for e in ev if e.get("cat") not in ("ac2g", "fwdbwd") and e.get("ph") not in ("s", "f")]
    tr["ghsim_note"] = "flow events (ac2g, fwdbwd) removed by validation/harness/train_step.py slim_trace"
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(tr, f, separators=(",", ":"))


def _memcpy_bytes(mem):
    out = {}
    for e in mem:
        n = e.get("name", "?")
        b = (e.get("args") or {}).get("bytes", 0)
        d = out.setdefault(n, {"count": 0, "bytes": 0, "time_s": 0.0})
        d["count"] += 1
        d["bytes"] += int(b or 0)
        d["time_s"] += e["dur"] * 1e-6
    return out


# ----------------------------------------------------------------------------- runner
class Runner:
    def __init__(self, spec: dict, tiny: bool):
        self.spec = {**DEFAULTS, **spec}
        self.tiny = tiny
        s = self.spec
        self.dist = s["mode"] in ("ddp", "fsdp")
        self.rank, self.world = 0, 1
        self.cuda = torch.cuda.is_available() and not tiny
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        if self.dist:
            import torch.distributed as dist
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29511")
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            dist.init_process_group("nccl" if self.cuda else "gloo",
                                    device_id=self.device if self.cuda else None)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        prec = s["precision"]
        tf32 = prec == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        self.amp = prec in ("bf16", "fp8") and s["mode"] != "fsdp"
        self.extra = {"spec": s, "gqa_enable_gqa": gqa_supported()}

    # ---------------------------------------------------------------- build
    def build(self):
        s = self.spec
        mc = dict(s["model"])
        cfg = ModelConfig(**{k: v for k, v in mc.items() if k in ModelConfig.__dataclass_fields__})
        if self.tiny:
            gqa = cfg.num_kv_heads < cfg.num_attention_heads
            cfg = ModelConfig(name=cfg.name, hidden_size=64, intermediate_size=128, num_layers=2,
                              num_attention_heads=4, num_kv_heads=2 if gqa else 4,
                              head_dim=16, vocab_size=128, max_seq_len=64, source=cfg.source)
            s["seq"] = min(s["seq"], 32)
            s["micro_batch"] = min(s["micro_batch"], 2)
            s["warmup"], s["steps"] = 1, 3
        self.cfg = cfg
        fp8 = s["precision"] == "fp8"
        if fp8 and self.cuda:
            chk = fp8_selfcheck("cuda")
            self.extra["fp8_selfcheck_rel_err"] = chk
            bad = any(not (v < 0.2) for v in chk["fp8_bwd"].values())
            if bad:
                s["fp8_backward"] = False
                self.extra["fp8_backward_fallback"] = "fp8 backward failed self-check; bf16 backward used"
        base_dtype = torch.bfloat16 if (s["lora_rank"] > 0 and s["precision"] in ("bf16", "fp8")) else None
        torch.manual_seed(1234 + self.rank)
        build_dev = self.device
        model = build_model(cfg, build_dev, s["recompute"], s["lora_rank"], fp8, s["fp8_backward"], base_dtype)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.extra.update(n_params=self.n_params, n_trainable=self.n_trainable)
        mode = s["mode"]
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[self.device.index] if self.cuda else None)
        elif mode == "fsdp":
            import functools
            from torch.distributed.fsdp import (CPUOffload, FullyShardedDataParallel as FSDP,
                                                MixedPrecision, ShardingStrategy)
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                buffer_dtype=torch.bfloat16)
            strat = ShardingStrategy.FULL_SHARD if s["zero"] == 3 else ShardingStrategy.SHARD_GRAD_OP
            pol = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
            model = FSDP(model, auto_wrap_policy=pol, mixed_precision=mp, sharding_strategy=strat,
                         cpu_offload=CPUOffload(offload_params=bool(s["fsdp_cpu_offload"])),
                         device_id=self.device if self.cuda else None, use_orig_params=False)
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        impl = s["optimizer_impl"]
        self.offload_opt = "optimizer" in s["offload"] and mode != "fsdp"
        if self.offload_opt:
            self._setup_cpu_optimizer(params)
        elif mode == "fsdp" and s["fsdp_cpu_offload"]:
            self.opt, used = self._cpu_adamw(params)
            self.extra["optimizer_used"] = used
        else:
            kw = {"fused": True} if impl == "fused" else {"foreach": True}
            if not self.cuda:
                kw = {"foreach": True}
            self.opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **kw)
            self.extra["optimizer_used"] = f"torch.optim.AdamW({kw})"
        V = cfg.vocab_size
        g = torch.Generator(device="cpu").manual_seed(7 + self.rank)
        self.tokens = torch.randint(0, V, (s["micro_batch"], s["seq"]), generator=g).to(self.device)
        self.labels = torch.randint(0, V, (s["micro_batch"], s["seq"]), generator=g).to(self.device)

    def _cpu_adamw(self, params):
        try:
            opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, fused=True)
            # probe: fused CPU support is checked at step time in some versions
            return opt, "torch.optim.AdamW(fused=True) on CPU"
        except Exception as e:  # noqa: BLE001
            return (torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=True),
                    f"torch.optim.AdamW(foreach=True) on CPU (fused failed: {e})")

    def _setup_cpu_optimizer(self, params):
        self.gpu_params = params
        n = sum(p.numel() for p in params)
        pin = self.cuda
        self.cpu_flat_p = torch.empty(n, dtype=torch.float32, pin_memory=pin)
        self.cpu_flat_g = torch.empty(n, dtype=torch.float32, pin_memory=pin)
        self.cpu_params, off = [], 0
        for p in params:
            k = p.numel()
            cp = self.cpu_flat_p[off:off + k].view_as(p)
            cp.copy_(p.detach().float().cpu())
            cp = torch.nn.Parameter(cp)
            cp.grad = self.cpu_flat_g[off:off + k].view_as(p)
            self.cpu_params.append(cp)
            off += k
        self.opt, used = self._cpu_adamw(self.cpu_params)
        self.extra["optimizer_used"] = used + "; grads D2H into pinned flat fp32, params H2D back"

    # ---------------------------------------------------------------- step
    def step(self):
        s = self.spec
        opt = self.opt
        if self.offload_opt:
            for p in self.gpu_params:
                p.grad = None
        else:
            opt.zero_grad(set_to_none=True)
        ctx = contextlib.ExitStack()
        if self.amp:
            ctx.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        if "activations" in s["offload"]:
            ctx.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=self.cuda))
        with ctx:
            loss = self.model(self.tokens, self.labels)
        loss.backward()
        if self.offload_opt:
            for p, cp in zip(self.gpu_params, self.cpu_params):
                cp.grad.copy_(p.grad, non_blocking=True)
            if self.cuda:
                torch.cuda.synchronize()
            opt.step()
            for p, cp in zip(self.gpu_params, self.cpu_params):
                p.data.copy_(cp.data, non_blocking=True)
        else:
            opt.step()
        if self.cuda:
            torch.cuda.synchronize()
        return loss

    # ---------------------------------------------------------------- measure
    def run(self, out_root: Path, deadline: float):
        s = self.spec
        self.build()
        for _ in range(s["warmup"]):
            loss = self.step()
        self.extra["loss_after_warmup"] = float(loss.detach())
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(s["steps"]):
            t0 = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - t0)
            if i >= 7 and time.time() > deadline - 4 * max(times) - 20:
                break
        peak_alloc = torch.cuda.max_memory_allocated() if self.cuda else 0
        peak_res = torch.cuda.max_memory_reserved() if self.cuda else 0
        self.extra["step_times_s"] = times
        case_dir = out_root / s["name"]
        if self.rank == 0:
            case_dir.mkdir(parents=True, exist_ok=True)
        trace_path = case_dir / "trace.pt.trace.json.gz"
        util = {}
        active = s["profile_active"]
        if time.time() + (2 + active) * statistics.median(times) + 30 < deadline:
            from torch.profiler import ProfilerActivity, profile, schedule
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=active),
                         record_shapes=False, with_stack=False) as prof:
                for _ in range(2 + active):
                    self.step()
                    prof.step()
            if self.rank == 0:
                prof.export_chrome_trace(str(trace_path))
                slim_trace(trace_path)
                if trace_path.stat().st_size > 8e6:
                    self.extra["trace_note"] = f"trace {trace_path.stat().st_size} B > 8 MB"
                util = kernel_utilization(trace_path)
        self.extra["trace_analysis"] = util
        # per-rank peaks
        peaks = [(peak_alloc, peak_res)]
        if self.dist:
            import torch.distributed as dist
            peaks = [None] * self.world
            dist.all_gather_object(peaks, (peak_alloc, peak_res))
        self.extra["per_rank_peak_allocated_reserved_bytes"] = peaks
        if self.rank == 0:
            self.write(case_dir, times, peaks, util, trace_path)
        if self.dist:
            import torch.distributed as dist
            dist.barrier()
            dist.destroy_process_group()

    def write(self, case_dir: Path, times, peaks, util, trace_path):
        s = self.spec
        gpu = torch.cuda.get_device_name(self.device) if self.cuda else "cpu"
        med = statistics.median(times)
        tokens = s["micro_batch"] * s["seq"] * self.world
        method = ("validation/harness/train_step.py: random weights and random tokens; step = "
                  "zero_grad(set_to_none) + forward + loss.backward() + optimizer.step() + "
                  "torch.cuda.synchronize(), host perf_counter; "
                  f"{s['warmup']} warm-up steps, median of {len(times)} timed steps; "
                  "peak from torch.cuda.max_memory_allocated/reserved after reset_peak_memory_stats "
                  "(rank 0; all ranks in measured_extra.json); "
                  f"torch.profiler trace of {s['profile_active']} steps (wait 1, warmup 1), "
                  "gpu_utilization = union of kernel intervals / wall of the profiled ProfilerSteps")
        if self.world > 1:
            method += f"; {self.world} ranks via torchrun, tokens_per_s counts all ranks"
        desc = s["description"] or s["name"]
        offl = s["offload"]
        plan = {
            "gpus": self.world,
            "gpus_per_node": self.world,
            "precision": s["precision"],
            "recompute": s["recompute"],
            "micro_batch": s["micro_batch"],
            "seq": s["seq"],
            "grad_accum": 1,
            "lora_rank": s["lora_rank"],
            "offload": offl,
            "zero": s["zero"],
            "optimizer": "adamw",
            "optimizer_impl": s["optimizer_impl"],
            "framework": s["framework"],
        }
        case = {
            "name": s["name"],
            "description": desc,
            "hardware": s["hardware"] or hardware_name(gpu),
            "date": _dt.date.today().isoformat(),
            "gpu": gpu,
            "software": software_string(),
            "method": method,
        }
        if trace_path.exists():
            case["trace"] = trace_path.name
        model = self.cfg.toml_dict()
        measured = {
            "step_time_s": med,
            "step_time_s_min": min(times),
            "step_time_s_max": max(times),
            "peak_allocated_bytes": int(peaks[0][0]),
            "peak_reserved_bytes": int(peaks[0][1]),
            "gpu_utilization": round(float(util.get("gpu_utilization_kernels", 0.0)), 4),
            "tokens_per_s": tokens / med,
        }
        ncores = os.cpu_count() or 0
        hw = {"cpu.cores": {"value": ncores,
                            "source": f"measured machine: {ncores} vCPUs (os.cpu_count) in a Firecracker VM"}}
        text = toml_dump({"case": case, "model": model, "plan": plan, "measured": measured,
                          "hardware_overrides": hw})
        (case_dir / "case.toml").write_text(text)
        (case_dir / "measured_extra.json").write_text(json.dumps(self.extra, indent=1, default=str))
        print(f"CASE {s['name']}: step {med*1e3:.1f} ms (min {min(times)*1e3:.1f}, max {max(times)*1e3:.1f}) "
              f"peak {peaks[0][0]/1e9:.2f} GB alloc, {peaks[0][1]/1e9:.2f} GB res, "
              f"util {measured['gpu_utilization']:.3f}, {measured['tokens_per_s']:.0f} tok/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="JSON string or path to a JSON file")
    ap.add_argument("--out", default=str(REPO / "validation" / "cases"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny model")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds; trims timed steps/profile")
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text()) if os.path.exists(a.spec) else json.loads(a.spec)
    deadline = a.deadline or time.time() + 3600
    Runner(spec, a.tiny).run(Path(a.out), deadline)


if __name__ == "__main__":
    main()
