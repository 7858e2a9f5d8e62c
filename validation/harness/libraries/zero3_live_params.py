"""Which fetched parameters DeepSpeed ZeRO-3 + offload_param holds on the GPU at the loss (issue 14,
session 5, second round). A microbenchmark, not a library case: a Llama-shaped model of 2.5e8
parameters (hidden 1536, 8 layers, vocab 32000, tied embeddings, gradient checkpointing), mb 2, seq
1024, ZeRO-3 with offload_param and offload_optimizer (cpu, pinned), 4 steps (DeepSpeed's parameter
trace is recorded in step 2 and used from step 3 on), under several stage3_max_live_parameters /
stage3_max_reuse_distance / stage3_prefetch_bucket_size settings. Per step: the HBM peak; after the
LM head's forward (the loss follows): the coordinator's count of available parameters, every
non-persistent parameter whose ds_status is AVAILABLE (by name) and memory_allocated; the elements
the coordinator gathers in forward and in backward (its __all_gather_params wrapped).

    python3 validation/harness/libraries/zero3_live_params.py --out $OUT/zero3_live_params.json

Ran once, 2026-11-27, lent nvidia-h100-x1 (torch and transformers of the device image, DeepSpeed 0.19.8
pure-Python wheel, DeepSpeedCPUAdam JIT-built in the first child) -> _raw/zero3_live_params.json; its
child runner is since lib_step.run_child (the same subprocess and RESULT line).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib_step import run_child  # noqa: E402 (the same folder)

MID = dict(hidden=1536, inter=4096, layers=8, heads=12, kv=4, vocab=32000)
CONFIGS = {  # name -> zero_optimization overrides (stage3_* keys as users write them)
    "defaults": {},
    "live1e8_reuse0": {"stage3_max_live_parameters": 100_000_000, "stage3_max_reuse_distance": 0,
                       "stage3_prefetch_bucket_size": 10_000_000},
    "live1.6e8_reuse0": {"stage3_max_live_parameters": 160_000_000, "stage3_max_reuse_distance": 0,
                         "stage3_prefetch_bucket_size": 10_000_000},
    "live1e8_reuse1e9": {"stage3_max_live_parameters": 100_000_000, "stage3_prefetch_bucket_size": 10_000_000},
}


def child(name):
    import torch
    torch.cuda.set_device(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM
    m = MID
    cfg = LlamaConfig(hidden_size=m["hidden"], intermediate_size=m["inter"], num_hidden_layers=m["layers"],
                      num_attention_heads=m["heads"], num_key_value_heads=m["kv"], vocab_size=m["vocab"],
                      tie_word_embeddings=True, use_cache=False, attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    names = {id(p): n for n, p in model.named_parameters()}
    off = {"device": "cpu", "pin_memory": True}
    zero = {"stage": 3, "contiguous_gradients": True, "offload_optimizer": off, "offload_param": off,
            **CONFIGS[name]}
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "bf16": {"enabled": True}, "zero_optimization": zero, "steps_per_print": 10 ** 9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                    "weight_decay": 0.1}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    coord = engine.optimizer.parameter_offload.get_param_coordinator()
    P = "_PartitionedParameterCoordinator__"
    gathered = {"fwd": 0, "bwd": 0}
    orig = getattr(coord, P + "all_gather_params")

    def wrapped(params, forward):
        gathered["fwd" if forward else "bwd"] += sum(p.ds_numel for p in params
                                                     if p.ds_status.name == "NOT_AVAILABLE")
        return orig(params, forward)
    setattr(coord, P + "all_gather_params", wrapped)
    at_loss = {}

    def after_head(module, inputs, output):
        live = [(names.get(id(p), "?"), p.ds_numel) for p in model.parameters()
                if p.ds_status.name == "AVAILABLE" and not p.ds_persist]
        at_loss.update(n_available=getattr(coord, P + "n_available_params"), allocated=torch.cuda.memory_allocated(),
                       live_numel=sum(n for _, n in live), live=[n for n, _ in live])
    model.lm_head.register_forward_hook(after_head)
    ids = torch.randint(0, m["vocab"], (2, 1024), device="cuda")
    steps = []
    for _ in range(4):
        gathered.update(fwd=0, bwd=0)
        at_loss.clear()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        steps.append({"s": time.perf_counter() - t, "hbm_peak": torch.cuda.max_memory_allocated(),
                      "gathered": dict(gathered), "at_loss": dict(at_loss)})
    return {"config": name, "zero": zero, "n_params": sum(p.ds_numel for p in model.parameters()),
            "persistent": sum(p.ds_numel for p in model.parameters() if p.ds_persist),
            "deepspeed": deepspeed.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
            "steps": steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child), default=str), flush=True)
        os._exit(0)
    results = {}
    for name in CONFIGS:
        t = time.time()
        results[name] = run_child(__file__, name, 150)
        last = results[name].get("steps", [{}])[-1]
        print(f"{name}: {time.time() - t:.0f}s peak={last.get('hbm_peak')} "
              f"live={last.get('at_loss', {}).get('live_numel')} {results[name].get('error', '')[-300:]}", flush=True)
        with open(a.out, "w") as f:
            json.dump({"results": results, "meta": {"cpu_count": os.cpu_count(), "when": time.strftime("%F %T")}},
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
