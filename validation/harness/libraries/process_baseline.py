"""The training process's own host memory before any model or optimizer state: VmHWM / VmRSS of a
fresh Python process after each start-up stage a library run goes through (import torch; CUDA
context; transformers' Llama; DeepSpeed). Each stage runs in its own process, `REPEATS` times, so
the figure is what that stage alone leaves resident. Writes JSON to argv[1]."""

import json
import subprocess
import sys

REPEATS = 3
_CUDA = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize();"
STAGES = {
    "python": "",
    "import_torch": "import torch",
    "cuda_context": _CUDA,
    "cuda_transformers": (_CUDA + "from transformers import LlamaForCausalLM, LlamaConfig"),
    "cuda_transformers_deepspeed": (_CUDA + "from transformers import LlamaForCausalLM, LlamaConfig; import deepspeed"),
    # the libraries a first training step loads lazily: cuBLAS(Lt) for a bf16 GEMM, cuDNN for SDPA's
    # backward, and a tiny HF Llama (2 layers, hidden 256) trained one step with fused AdamW
    "cuda_gemm_sdpa": (_CUDA + "a = torch.randn(1024, 1024, device='cuda', dtype=torch.bfloat16, requires_grad=True);"
                       "(a @ a).sum().backward();"
                       "q = torch.randn(1, 8, 256, 64, device='cuda', dtype=torch.bfloat16, requires_grad=True);"
                       "torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward();"
                       "torch.cuda.synchronize()"),
    "tiny_llama_step": (_CUDA + "from transformers import LlamaForCausalLM, LlamaConfig;"
                        "m = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,"
                        " num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)).to('cuda', torch.bfloat16);"
                        "o = torch.optim.AdamW(m.parameters(), fused=True); x = torch.randint(0, 1024, (2, 256), device='cuda');"
                        "m(input_ids=x, labels=x).loss.backward(); o.step(); torch.cuda.synchronize()"),
}
STAGES["tiny_llama_step_deepspeed"] = STAGES["tiny_llama_step"] + "; import deepspeed"
PROBE = """
{code}
import json
def kb(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
print(json.dumps({{'VmHWM': kb('VmHWM:'), 'VmRSS': kb('VmRSS:')}}))
"""


def main(out: str) -> None:
    results = {}
    for name, code in STAGES.items():
        runs = []
        for _ in range(REPEATS):
            p = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-400:]})
        results[name] = runs
        print(name, runs, flush=True)
    import torch
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "python": sys.version.split()[0]}
    json.dump({"meta": meta, "stages": results}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
