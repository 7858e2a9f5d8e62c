"""The two-rank DeepSpeed ZeRO-3 + offload_optimizer runs (issue 14) as library cases.

    python3 validation/harness/libraries/make_cases_ds_x2.py [TRACE_DIR]

Raw results: validation/measured_libraries/_raw/ds_x2/results_ds2.json (rank 0's result, rank 1's under
"ranks"; host.txt holds lscpu, free -g, nvidia-smi topo of the machine), taken 2026-11-27 in one call on a
lent 2 x H200 machine (32 vCPUs, one socket, Intel Xeon with AVX-512 and AMX, 251 GiB) by
validation/harness/libraries/run_ds_x2.sh = prelude.sh (WHL=whl DS_OPS=CPUAdam) + batch.py --set ds2:
each case launched as DeepSpeed's docs launch it, `deepspeed --num_gpus 2 lib_step.py ...`
(deepspeed.launcher.runner -> launch.py), which leaves OMP_NUM_THREADS unset: torch.get_num_threads() = 32
on each rank, and DeepSpeedCPUAdam's op (its .so links no OpenMP runtime of its own) runs on torch's
libgomp, omp_get_max_threads() = 32 on each rank: 64 threads on 32 cores while both ranks step.
2 warm-up + 3 timed steps; 8B's profiled step was skipped for the call's time budget (no trace).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from make_cases import MODEL, SOFT, _copy_trace, plan_for, tq
from make_cases_fsdp2_x2 import measured_ranks

LIB = Path(__file__).resolve().parents[2] / "measured_libraries"
RAW = LIB / "_raw" / "ds_x2"
HOST = ('"cpu.cores" = { value = 32, source = "measured machine: 32 vCPUs (os.cpu_count, lscpu: 1 socket, 1 thread '
        'per core, Intel Xeon with AVX-512 and AMX; _raw/ds_x2/host.txt) of the lent 2 x H200 machine" }')
METHOD = ("validation/harness/libraries/lib_step.py under `deepspeed --num_gpus 2` (batch.py --set ds2, "
          "make_cases_ds_x2.py): HF LlamaForCausalLM from LlamaConfig, random weights, random tokens per rank, "
          "labels=input_ids; step = engine forward + backward + step + torch.cuda.synchronize(), host perf_counter; "
          "2 warm-up steps, median of 3 timed (rank 0's); HBM peaks the larger rank's max_memory_allocated/reserved "
          "after reset_peak_memory_stats (after init); host peak = the two ranks' /proc/self/status VmHWM added "
          "(per node); pinned = the two ranks' torch.cuda.host_memory_stats allocated_bytes.peak added")
UNTIED = {"8b"}  # lib_step.MODELS: Llama-3.1-8B has a separate lm_head


def case_toml(r0: dict, ranks: list[dict], trace: bool) -> str:
    sp = r0["spec"]
    mname, h, i, L, nh, kv, hd = MODEL[sp["model"]]
    family = "Llama-3.1" if sp["model"] in UNTIED else "Llama-3.2"
    plan, notes = plan_for(r0)
    plan.update(gpus=2, gpus_per_node=2, cpu_threads=r0["torch_threads"])
    omp = [o for o in r0.get("openmp_after_steps", []) if "torch/lib/libgomp" in o.get("lib", "")]
    notes.insert(1, f"launcher: deepspeed --num_gpus 2 (OMP_NUM_THREADS {r0['launch_env']['OMP_NUM_THREADS'] or 'unset'}); "
                    f"torch's libgomp omp_get_max_threads()={omp[0]['omp_get_max_threads'] if omp else '?'} per rank, "
                    f"which DeepSpeedCPUAdam's op uses; CPU time {r0['process_cpu_s_per_timed_step']:.1f} s per "
                    f"timed step on rank 0 ({r0['process_cpu_s_per_timed_step'] / r0['step_time_s']:.1f} cores busy "
                    "on average)")
    desc = (f"DeepSpeed ZeRO-3 {json.dumps({'offload_optimizer': sp['ds']['offload_optimizer']})} on 2 GPUs "
            f"(deepspeed launcher), {mname}, mb{sp['mb']} seq{sp['seq']}, grad ckpt")
    lines = ["[case]", f"name = {tq(r0['name'])}", f"description = {tq(desc)}", 'hardware = "h200-sxm"',
             'date = "2026-11-27"', f"gpu = {tq(r0['gpu'] + ' x 2')}", f"software = {tq(SOFT.replace('CPUAdam/FusedAdam', 'CPUAdam'))}",
             f"method = {tq(METHOD)}"]
    if trace:
        lines.append('trace = "trace.pt.trace.json.xz"')
    lines += [f"plan_notes = {tq(' | '.join(notes))}", "", "[model]", f"name = {tq(mname)}",
              f"source = {tq(f'synthetic, HF LlamaConfig with the {mname} ({family}) dimensions, random weights')}",
              f"hidden_size = {h}", f"intermediate_size = {i}", f"num_layers = {L}", f"num_attention_heads = {nh}",
              f"num_kv_heads = {kv}", f"head_dim = {hd}", "vocab_size = 128256",
              f"tie_embeddings = {'false' if sp['model'] in UNTIED else 'true'}", "max_seq_len = 2048", "", "[plan]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in plan.items()]
    lines += ["", "[measured]"] + [f"{k} = {v!r}" for k, v in measured_ranks(ranks).items()]
    return "\n".join(lines + ["", "[hardware_overrides]", HOST, ""])


def main() -> None:
    trace_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else RAW
    for r0 in json.loads((RAW / "results_ds2.json").read_text()):
        if not r0.get("ok") or r0["spec"]["model"] == "tiny":
            continue  # the tiny model is the launcher path's smoke test only
        ranks = [r0] + r0.get("ranks", [])
        folder = LIB / r0["name"]
        folder.mkdir(exist_ok=True)
        trace = _copy_trace(r0, trace_dir, folder)
        (folder / "case.toml").write_text(case_toml(r0, ranks, trace))
        (folder / "result.json").write_text(json.dumps(ranks, indent=1, default=str) + "\n")
        print(f"wrote {folder}")


if __name__ == "__main__":
    main()
