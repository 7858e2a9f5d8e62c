"""Synthetic traces with known totals, for tests and the large-trace benchmark.

write_kineto() streams a PyTorch-profiler-shaped trace of any size (old or
new timestamp format, plain or gzipped) and returns what an importer must
find in it; write_nsys_sqlite() builds an nsys export in one of several
schema generations. Both are deterministic for a given seed.

    python tests/synthetic_traces.py --bench 400      # ~400 MB trace: time and peak RSS
"""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
from collections import defaultdict
from pathlib import Path

# Kernel names as they appear in H100 LLM training traces, with their category.
KERNELS = (
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8> >(Flash_bwd_params)", "attention"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, at::detail::Array<char*, 2>)", "elementwise"),
    ("triton_poi_fused_mul_silu_0", "elementwise"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norm_reduction"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", "norm_reduction"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, bool, float>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, bool, float)", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void cutlass::Kernel2<cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_2x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma>(cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_2x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma::Params)", "gemm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "norm_reduction"),
)
COPIES = (("HtoD", "Pinned", "Device"), ("HtoD", "Pageable", "Device"), ("DtoH", "Device", "Pinned"),
          ("DtoD", "Device", "Device"))
BASE_NS = 1_711_964_646_000_000_000


class _Expect:
    def __init__(self):
        self.kernels = 0
        self.kernel_ns = 0
        self.kernel_ns_by_category: dict[str, int] = defaultdict(int)
        self.copies: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # kind -> count, bytes, ns
        self.memsets = [0, 0]
        self.steps: dict[int, int] = {}
        self.peak = (0, 0)

    def as_dict(self) -> dict:
        return {"kernels": self.kernels, "kernel_ns": self.kernel_ns,
                "kernel_ns_by_category": dict(self.kernel_ns_by_category),
                "copies": {k: tuple(v) for k, v in self.copies.items()}, "memsets": tuple(self.memsets),
                "steps": dict(self.steps), "memory_peak": self.peak}


def write_kineto(path: str | Path, *, steps: int = 3, kernels_per_step: int = 40, first_step: int = 1,
                 new_format: bool = True, gz: bool = False, memory_events: bool = True,
                 cpu_events_per_kernel: int = 2, seed: int = 0) -> dict:
    """Write a Kineto-style trace; return the totals an importer must read back."""
    rng = random.Random(seed)
    exp = _Expect()
    opener = gzip.open if gz else open
    # Old traces are whole microseconds; new ones carry a nanosecond fraction.
    quantum = 1 if new_format else 1000
    base = BASE_NS if new_format else 0
    t = (1_700_000_000_000_000_000 if not new_format else BASE_NS + 4_458_676_388_068_751) // 1000 * 1000

    def us(ns: int) -> str:
        rel = ns - base
        return f"{rel // 1000}.{rel % 1000:03d}" if new_format else str(rel // 1000)

    def q(ns: int) -> int:
        return max(quantum, ns // quantum * quantum)

    allocated, reserved, ext = 1 << 30, 2 << 30, 0
    with opener(path, "wt", encoding="utf-8") as f:
        f.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "NVIDIA H100 80GB HBM3", '
                '"totalGlobalMem": 85028896768, "computeMajor": 9, "computeMinor": 0, "numSms": 132}\n  ],\n'
                '  "traceEvents": [\n')
        first = True

        def emit(text: str) -> None:
            nonlocal first
            f.write(text if first else ",\n" + text)
            first = False

        for step in range(first_step, first_step + steps):
            step_start = t
            gpu_t = t + q(50_000)
            for _ in range(kernels_per_step):
                name, cat = KERNELS[rng.randrange(len(KERNELS))]
                dur = q(rng.randint(2_000, 400_000))
                gap = q(rng.randint(500, 20_000))
                ext += 1
                for j in range(cpu_events_per_kernel):
                    emit(f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "aten::op_{j}", "pid": 4242, "tid": 4242,\n'
                         f'    "ts": {us(t)}, "dur": {us(base + q(3000))},\n    "args": {{\n      "External id": {ext}, '
                         f'"Record function id": 0, "Ev Idx": {ext * 3 + j}, "Input Dims": [[4096, 4096], [4096]], '
                         f'"Input type": ["c10::BFloat16", "c10::BFloat16"]\n    }}\n  }}')
                emit(f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,\n'
                     f'    "ts": {us(t + q(1000))}, "dur": {us(base + q(4000))},\n    "args": {{\n      "External id": {ext}, '
                     f'"cbid": 211, "correlation": {ext}\n    }}\n  }}')
                emit(f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7,\n'
                     f'    "ts": {us(gpu_t)}, "dur": {us(base + dur)},\n    "args": {{\n      "External id": {ext}, '
                     f'"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": {ext}, '
                     f'"registers per thread": 168, "shared memory": 0, "blocks per SM": 1.0, "warps per SM": 4.0, '
                     f'"grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 6\n    }}\n  }}')
                emit(f'  {{"ph": "f", "id": {ext}, "pid": 0, "tid": 7, "ts": {us(gpu_t)}, "cat": "ac2g", '
                     f'"name": "ac2g", "bp": "e"}}')
                exp.kernels += 1
                exp.kernel_ns += dur
                exp.kernel_ns_by_category[cat] += dur
                gpu_t += dur + gap
                t += q(6_000)
                if rng.random() < 0.05:
                    kind, src, dst = COPIES[rng.randrange(len(COPIES))]
                    nbytes, cdur = rng.randint(1, 1 << 26), q(rng.randint(1_000, 200_000))
                    emit(f'  {{\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy {kind} ({src} -> {dst})", '
                         f'"pid": 0, "tid": 7,\n    "ts": {us(gpu_t)}, "dur": {us(base + cdur)},\n    "args": {{\n'
                         f'      "External id": {ext}, "device": 0, "context": 1, "stream": 7, "correlation": {ext}, '
                         f'"bytes": {nbytes}, "memory bandwidth (GB/s)": {nbytes / cdur:.6f}\n    }}\n  }}')
                    c = exp.copies[kind]
                    c[0] += 1; c[1] += nbytes; c[2] += cdur
                    gpu_t += cdur + gap
                if rng.random() < 0.03:
                    nbytes, sdur = rng.randint(4, 1 << 20), q(rng.randint(1_000, 9_000))
                    emit(f'  {{\n    "ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,\n'
                         f'    "ts": {us(gpu_t)}, "dur": {us(base + sdur)},\n    "args": {{\n      "device": 0, '
                         f'"stream": 7, "bytes": {nbytes}\n    }}\n  }}')
                    exp.memsets[0] += 1; exp.memsets[1] += nbytes
                    gpu_t += sdur + gap
                if memory_events and rng.random() < 0.2:
                    delta = rng.randint(-(1 << 24), 1 << 25)
                    allocated = max(allocated + delta, 0)
                    reserved = max(reserved, allocated + (1 << 20))
                    emit(f'  {{\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", '
                         f'"pid": 4242, "tid": 4242,\n    "ts": {us(t)},\n    "args": {{\n      "Total Reserved": '
                         f'{reserved}, "Total Allocated": {allocated}, "Bytes": {delta}, "Addr": 140098913959936, '
                         f'"Device Id": 0, "Device Type": 1, "Ev Idx": {ext}\n    }}\n  }}')
                    exp.peak = (max(exp.peak[0], allocated), max(exp.peak[1], reserved))
            t = max(t, gpu_t) + q(20_000)
            exp.steps[step] = t - step_start
            emit(f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 4242, '
                 f'"tid": 4242,\n    "ts": {us(step_start)}, "dur": {us(base + t - step_start)},\n    "args": {{\n'
                 f'      "External id": {step}, "Ev Idx": 0\n    }}\n  }}')
            t += q(40_000)
        f.write('\n  ],\n  "traceName": "synthetic.json"')
        if new_format:
            f.write(f',\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS}')
        f.write("\n}\n")
    return exp.as_dict()


# -- nsys SQLite ---------------------------------------------------------------------

_KERNEL_COLS = {
    "2024": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            "greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
            "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
            "registersPerThread INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, graphNodeId INTEGER",
    "2022": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
            "shortName INTEGER NOT NULL, mangledName INTEGER, registersPerThread INTEGER",
    "2020": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
            "streamId INTEGER NOT NULL, correlationId INTEGER, demangledName INTEGER NOT NULL, "
            "shortName INTEGER NOT NULL",
}


def write_nsys_sqlite(path: str | Path, *, schema: str = "2024", steps: int = 3, kernels_per_step: int = 30,
                      devices: int = 2, um: bool = True, seed: int = 0) -> dict:
    """Build an nsys-export-like SQLite file of one schema generation ("2020", "2022", "2024")."""
    rng = random.Random(seed)
    path = Path(path)
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    db.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({_KERNEL_COLS[schema]})")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, "
               "deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, bytes INTEGER NOT NULL, "
               "copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, migrationCause INTEGER"
               + (", name TEXT" if schema == "2022" else "") + ")")
    if schema != "2020":
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                   "deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, value INTEGER, "
                   "bytes INTEGER NOT NULL, memKind INTEGER)")
        db.execute("CREATE TABLE CUDA_UM_CPU_PAGE_FAULT_EVENTS (start INTEGER NOT NULL, globalPid INTEGER, "
                   "address INTEGER, CpuInstruction INTEGER, module INTEGER)")
        db.execute("CREATE TABLE CUDA_UM_GPU_PAGE_FAULT_EVENTS (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                   "globalPid INTEGER, deviceId INTEGER NOT NULL, address INTEGER, numberOfPageFaults INTEGER, "
                   "faultAccessType INTEGER)")
    nvtx_cols = "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, text TEXT, globalTid INTEGER"
    if schema != "2020":
        nvtx_cols += ", textId INTEGER, domainId INTEGER"
    db.execute(f"CREATE TABLE NVTX_EVENTS ({nvtx_cols})")
    db.execute("CREATE TABLE TARGET_INFO_GPU (vmId INTEGER, id INTEGER NOT NULL, name TEXT, totalMemory INTEGER, "
               "smCount INTEGER" + (", memoryBandwidth INTEGER, clockRate INTEGER" if schema != "2020" else "") + ")")
    meta_table = {"2024": "META_DATA_EXPORT", "2022": "EXPORT_META_DATA", "2020": "EXPORT_META_DATA"}[schema]
    db.execute(f"CREATE TABLE {meta_table} (name TEXT NOT NULL, value TEXT)")
    db.execute(f"INSERT INTO {meta_table} VALUES ('EXPORT_PRODUCT_VERSION', ?)", ({"2024": "2024.5.1.113",
               "2022": "2022.2.1.31", "2020": "2020.3.1.72"}[schema],))
    if schema == "2024":
        db.execute("CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
        db.executemany("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (?, ?, ?)", [
            (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"), (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
            (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"), (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
            (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"), (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
            (12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host")])
        db.execute("CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
        db.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)", [
            (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"), (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
            (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"), (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed")])
    for d in range(devices):
        extra = (3_350_000_000_000, 1_980_000_000) if schema != "2020" else ()
        db.execute(f"INSERT INTO TARGET_INFO_GPU VALUES (0, ?, 'NVIDIA H100 80GB HBM3', 85028896768, 132"
                   f"{', ?, ?' if extra else ''})", (d, *extra))

    exp = _Expect()
    busy = defaultdict(list)
    um_ns = defaultdict(int)
    copy_kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP", 11: "UM_HtoD", 12: "UM_DtoH"}
    kernel_rows, copy_rows, memset_rows, nvtx_rows = [], [], [], []
    t = 1_000_000
    if schema != "2020":
        nvtx_rows.append((100, None, 75, None, "Training", 1, None, 7))       # domain create
        nvtx_rows.append((200, None, 34, None, "a mark", 1, None, 0))         # mark: not a range
    for step in range(1, steps + 1):
        step_start = t
        gpu_t = {d: t + 10_000 for d in range(devices)}
        for _ in range(kernels_per_step):
            for d in range(devices):
                name, cat = KERNELS[rng.randrange(len(KERNELS))]
                short = name.split("(")[0].split("<")[0].replace("void ", "")
                dur = rng.randint(1_000, 300_000)
                s = gpu_t[d]
                cols = [s, s + dur, d, 1]
                if schema == "2024":
                    cols += [None, 7, 0, 0, sid(name), sid(short), sid("_Z" + short), 0, 64, 132, 1, 1, None]
                elif schema == "2022":
                    cols += [7, 0, 0, sid(name), sid(short), None, 64]
                else:
                    cols += [7, 0, sid(name), sid(short)]
                kernel_rows.append(cols)
                busy[d].append((s, s + dur))
                if d == 0:
                    exp.kernels += 1
                    exp.kernel_ns += dur
                    exp.kernel_ns_by_category[cat] += dur
                gpu_t[d] = s + dur + rng.randint(100, 30_000)
                if rng.random() < 0.1:
                    kind = rng.choice([1, 2, 8, 10] + ([11, 12] if um else []))
                    nbytes, cdur = rng.randint(1, 1 << 24), rng.randint(500, 90_000)
                    src, dst = {1: (1, 2), 2: (2, 0), 11: (4, 2), 12: (2, 4)}.get(kind, (2, 2))
                    # UM migrations overlap kernels on their own engine.
                    cs = gpu_t[d] if kind < 11 else s
                    row = [cs, cs + cdur, d, 1, 20, nbytes, kind, src, dst, 2 if kind >= 11 else None]
                    copy_rows.append(row + ([None] if schema == "2022" else []))
                    if kind < 11:
                        gpu_t[d] = cs + cdur + 1_000
                    if d == 0:
                        c = exp.copies[copy_kinds[kind]]
                        c[0] += 1; c[1] += nbytes; c[2] += cdur
                        if kind >= 11:
                            um_ns[step] += cdur
                if schema != "2020" and rng.random() < 0.05:
                    nbytes = rng.randint(4, 1 << 20)
                    memset_rows.append((gpu_t[d], gpu_t[d] + 2_000, d, 1, 7, 0, nbytes, 2))
                    gpu_t[d] += 3_000
                    if d == 0:
                        exp.memsets[0] += 1; exp.memsets[1] += nbytes
        t = max(gpu_t.values()) + 5_000
        exp.steps[step] = t - step_start
        nvtx_rows.append((step_start, t, 59, None, f"ProfilerStep#{step}", 0, None, 0) if schema != "2020"
                         else (step_start, t, 59, None, f"ProfilerStep#{step}", 0))
        if schema != "2020":
            # A start/end range whose text lives in StringIds, in the "Training" domain.
            nvtx_rows.append((step_start + 1_000, t - 1_000, 60, step, None, 0, sid("forward_backward"), 7))
        t += 20_000
    db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * len(kernel_rows[0]))})",
                   kernel_rows)
    if copy_rows:
        db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES ({','.join('?' * len(copy_rows[0]))})",
                       copy_rows)
    if memset_rows:
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?,?,?,?,?,?,?,?)", memset_rows)
    db.executemany(f"INSERT INTO NVTX_EVENTS VALUES ({','.join('?' * len(nvtx_rows[0]))})", nvtx_rows)
    faults = {"cpu": 0, "gpu": 0}
    if schema != "2020" and um:
        for i in range(7):
            db.execute("INSERT INTO CUDA_UM_CPU_PAGE_FAULT_EVENTS VALUES (?, 1, 4096, 0, 0)", (1_000_000 + i * 10,))
            db.execute("INSERT INTO CUDA_UM_GPU_PAGE_FAULT_EVENTS VALUES (?, ?, 1, 0, 8192, 3, 1)",
                       (1_000_000 + i * 10, 1_000_500 + i * 10))
        faults = {"cpu": 7, "gpu": 21}
    db.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    db.commit()
    db.close()
    out = exp.as_dict()
    out["busy_intervals"] = {d: v for d, v in busy.items()}
    out["um_faults"] = faults
    return out


# -- the large-trace benchmark ------------------------------------------------------------


def _bench(size_mb: float, gz: bool, keep: str | None) -> None:
    import os
    import resource
    import subprocess
    import sys
    import tempfile
    import time

    # About 1,650 bytes of JSON per kernel with 2 CPU ops, a launch and a flow event around it.
    kernels = int(size_mb * 1e6 / 1650)
    steps = 20
    tmp = tempfile.mkdtemp()
    path = Path(keep or tmp) / ("large.pt.trace.json" + (".gz" if gz else ""))
    t0 = time.time()
    exp = write_kineto(path, steps=steps, kernels_per_step=max(1, kernels // steps), gz=gz)
    written = time.time() - t0
    size = path.stat().st_size
    raw = size
    if gz:
        with gzip.open(path, "rb") as f:
            raw = sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))
    code = ("import json, sys, time; from ghsim.traces import load_trace, summarize; t=time.time(); "
            f"tr=load_trace({str(path)!r}); t1=time.time(); s=summarize(tr, steps='3-5'); t2=time.time(); "
            "print(json.dumps({'load_s': t1-t, 'summarize_s': t2-t1, 'kernels': len(tr.kernels), "
            "'kernel_ns': int(tr.kernels.dur_ns.sum()), 'busy': s.gpu_busy_fraction}))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = json.loads(out.stdout)
    assert result["kernels"] == exp["kernels"] and result["kernel_ns"] == exp["kernel_ns"], (result, exp)
    print(json.dumps({"file": str(path), "file_bytes": size, "json_bytes": raw, "kernels": exp["kernels"],
                      "write_s": round(written, 1), "load_s": round(result["load_s"], 1),
                      "summarize_s": round(result["summarize_s"], 2), "peak_rss_mb": round(peak_kb / 1024, 1),
                      "child_rss_before_mb": round(before / 1024, 1), "totals_match": True}, indent=2))
    if not keep:
        path.unlink()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=float, metavar="MB", required=True, help="size of the trace to generate")
    parser.add_argument("--gz", action="store_true", help="gzip it")
    parser.add_argument("--keep", metavar="DIR", help="write it here and keep it")
    a = parser.parse_args()
    _bench(a.bench, a.gz, a.keep)
