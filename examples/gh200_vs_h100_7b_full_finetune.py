"""Story 2: a full fine-tune of Llama-2-7B on one GPU: GH200 96GB or a PCIe H100?

Runs the plan search on each part and prints the best plan, its step time and its
price per million tokens side by side, then why the winner wins.

    python examples/gh200_vs_h100_7b_full_finetune.py
"""

from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan
from ghsim.search.core import default_jobs, search
from ghsim.search.explain import reproduce_flags, why_best
from ghsim.search.objective import Objective
from ghsim.search.space import default_space

model = load_model("llama-2-7b")
base = Plan(gpus=1, seq=4096, global_batch=32, framework=Framework.DEEPSPEED, optimizer_impl="fused")
results = {}
for name in ("gh200-96gb", "h100-pcie"):
    hw = load_hardware(name)
    results[name] = search(model, hw, base, default_space(model, hw, base), Objective.TIME, jobs=default_jobs())

print(f"{'hardware':<12}{'plans':>8}{'fit':>6}{'step s':>9}{'tokens/s':>10}{'HBM GB':>8}{'$/Mtok':>8}  best plan")
for name, r in results.items():
    b = r.best
    if b is None:
        print(f"{name:<12}{r.n_evaluated:>8,}{0:>6}  nothing fits")
        continue
    print(f"{name:<12}{r.n_evaluated:>8,}{r.n_feasible:>6}{b.step_time_s:>9.2f}{b.tokens_per_s:>10,.0f}"
          f"{b.hbm_peak_bytes / 1e9:>8.1f}{b.usd_per_mtok(r.price_per_gpu_hour):>8.2f}  {reproduce_flags(b.plan)}")
gh, h100 = results["gh200-96gb"].best, results["h100-pcie"].best
if gh and h100:
    print(f"\nGH200 is {h100.step_time_s / gh.step_time_s:.2f}x the speed of a PCIe H100 on its best plan, at "
          f"{gh.usd_per_mtok(results['gh200-96gb'].price_per_gpu_hour) / h100.usd_per_mtok(results['h100-pcie'].price_per_gpu_hour):.2f}x the cost per token.")
for name, r in results.items():
    if r.best:
        print(f"\n{name}:")
        print("\n".join(why_best(r, limit=4)))
