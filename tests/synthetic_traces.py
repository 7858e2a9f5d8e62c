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


class _KinetoStream:
    """The events of a Kineto trace as they are written, with the clocks and counters they share."""

    def __init__(self, f, rng: random.Random, exp: _Expect, new_format: bool, memory_events: bool):
        self.f, self.rng, self.exp, self.new_format, self.memory_events = f, rng, exp, new_format, memory_events
        # Old traces are whole microseconds; new ones carry a nanosecond fraction.
        self.quantum = 1 if new_format else 1000
        self.base = BASE_NS if new_format else 0
        self.t = (1_700_000_000_000_000_000 if not new_format else BASE_NS + 4_458_676_388_068_751) // 1000 * 1000
        self.gpu_t = 0
        self.ext = 0
        self.allocated, self.reserved = 1 << 30, 2 << 30
        self.first = True

    def us(self, ns: int) -> str:
        rel = ns - self.base
        return f"{rel // 1000}.{rel % 1000:03d}" if self.new_format else str(rel // 1000)

    def q(self, ns: int) -> int:
        return max(self.quantum, ns // self.quantum * self.quantum)

    def emit(self, text: str) -> None:
        self.f.write(text if self.first else ",\n" + text)
        self.first = False

    def step(self, step: int, kernels: int, cpu_events_per_kernel: int) -> None:
        """One profiler step: its kernels with their launches, stray copies, memsets and memory events."""
        step_start = self.t
        self.gpu_t = self.t + self.q(50_000)
        for _ in range(kernels):
            gap = self.kernel(cpu_events_per_kernel)
            self.t += self.q(6_000)
            if self.rng.random() < 0.05:
                self.copy(gap)
            if self.rng.random() < 0.03:
                self.memset(gap)
            if self.memory_events and self.rng.random() < 0.2:
                self.memory()
        us, q = self.us, self.q
        self.t = max(self.t, self.gpu_t) + q(20_000)
        self.exp.steps[step] = self.t - step_start
        self.emit(f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 4242, '
                  f'"tid": 4242,\n    "ts": {us(step_start)}, "dur": {us(self.base + self.t - step_start)},\n'
                  f'    "args": {{\n      "External id": {step}, "Ev Idx": 0\n    }}\n  }}')
        self.t += q(40_000)

    def kernel(self, cpu_events: int) -> int:
        """A kernel, its CPU ops, launch and flow event; returns the gap the GPU leaves after it."""
        rng, us, q, exp = self.rng, self.us, self.q, self.exp
        name, cat = KERNELS[rng.randrange(len(KERNELS))]
        dur = q(rng.randint(2_000, 400_000))
        gap = q(rng.randint(500, 20_000))
        self.ext += 1
        ext, t, gpu_t = self.ext, self.t, self.gpu_t
        for j in range(cpu_events):
            self.emit(f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "aten::op_{j}", "pid": 4242, "tid": 4242,\n'
                      f'    "ts": {us(t)}, "dur": {us(self.base + q(3000))},\n    "args": {{\n      "External id": {ext}, '
                      f'"Record function id": 0, "Ev Idx": {ext * 3 + j}, "Input Dims": [[4096, 4096], [4096]], '
                      f'"Input type": ["c10::BFloat16", "c10::BFloat16"]\n    }}\n  }}')
        self.emit(f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,\n'
                  f'    "ts": {us(t + q(1000))}, "dur": {us(self.base + q(4000))},\n    "args": {{\n      "External id": {ext}, '
                  f'"cbid": 211, "correlation": {ext}\n    }}\n  }}')
        self.emit(f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7,\n'
                  f'    "ts": {us(gpu_t)}, "dur": {us(self.base + dur)},\n    "args": {{\n      "External id": {ext}, '
                  f'"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": {ext}, '
                  f'"registers per thread": 168, "shared memory": 0, "blocks per SM": 1.0, "warps per SM": 4.0, '
                  f'"grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 6\n    }}\n  }}')
        self.emit(f'  {{"ph": "f", "id": {ext}, "pid": 0, "tid": 7, "ts": {us(gpu_t)}, "cat": "ac2g", '
                  f'"name": "ac2g", "bp": "e"}}')
        exp.kernels += 1
        exp.kernel_ns += dur
        exp.kernel_ns_by_category[cat] += dur
        self.gpu_t += dur + gap
        return gap

    def copy(self, gap: int) -> None:
        rng, us, q, ext = self.rng, self.us, self.q, self.ext
        kind, src, dst = COPIES[rng.randrange(len(COPIES))]
        nbytes, cdur = rng.randint(1, 1 << 26), q(rng.randint(1_000, 200_000))
        self.emit(f'  {{\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy {kind} ({src} -> {dst})", '
                  f'"pid": 0, "tid": 7,\n    "ts": {us(self.gpu_t)}, "dur": {us(self.base + cdur)},\n    "args": {{\n'
                  f'      "External id": {ext}, "device": 0, "context": 1, "stream": 7, "correlation": {ext}, '
                  f'"bytes": {nbytes}, "memory bandwidth (GB/s)": {nbytes / cdur:.6f}\n    }}\n  }}')
        c = self.exp.copies[kind]
        c[0] += 1; c[1] += nbytes; c[2] += cdur
        self.gpu_t += cdur + gap

    def memset(self, gap: int) -> None:
        rng, us, q = self.rng, self.us, self.q
        nbytes, sdur = rng.randint(4, 1 << 20), q(rng.randint(1_000, 9_000))
        self.emit(f'  {{\n    "ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,\n'
                  f'    "ts": {us(self.gpu_t)}, "dur": {us(self.base + sdur)},\n    "args": {{\n      "device": 0, '
                  f'"stream": 7, "bytes": {nbytes}\n    }}\n  }}')
        self.exp.memsets[0] += 1; self.exp.memsets[1] += nbytes
        self.gpu_t += sdur + gap

    def memory(self) -> None:
        """A caching-allocator event: allocated bytes move, reserved bytes follow the high-water mark."""
        delta = self.rng.randint(-(1 << 24), 1 << 25)
        self.allocated = max(self.allocated + delta, 0)
        self.reserved = max(self.reserved, self.allocated + (1 << 20))
        self.emit(f'  {{\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", '
                  f'"pid": 4242, "tid": 4242,\n    "ts": {self.us(self.t)},\n    "args": {{\n      "Total Reserved": '
                  f'{self.reserved}, "Total Allocated": {self.allocated}, "Bytes": {delta}, "Addr": 140098913959936, '
                  f'"Device Id": 0, "Device Type": 1, "Ev Idx": {self.ext}\n    }}\n  }}')
        self.exp.peak = (max(self.exp.peak[0], self.allocated), max(self.exp.peak[1], self.reserved))


def write_kineto(path: str | Path, *, steps: int = 3, kernels_per_step: int = 40, first_step: int = 1,
                 new_format: bool = True, gz: bool = False, memory_events: bool = True,
                 cpu_events_per_kernel: int = 2, seed: int = 0) -> dict:
    """Write a Kineto-style trace; return the totals an importer must read back."""
    exp = _Expect()
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "NVIDIA H100 80GB HBM3", '
                '"totalGlobalMem": 85028896768, "computeMajor": 9, "computeMinor": 0, "numSms": 132}\n  ],\n'
                '  "traceEvents": [\n')
        stream = _KinetoStream(f, random.Random(seed), exp, new_format, memory_events)
        for step in range(first_step, first_step + steps):
            stream.step(step, kernels_per_step, cpu_events_per_kernel)
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
    path = Path(path)
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    _create_nsys_tables(db, schema, devices)
    rows = _NsysRows(random.Random(seed), schema, devices, um)
    if schema != "2020":
        rows.nvtx.append((100, None, 75, None, "Training", 1, None, 7))       # domain create
        rows.nvtx.append((200, None, 34, None, "a mark", 1, None, 0))         # mark: not a range
    for step in range(1, steps + 1):
        rows.step(step, kernels_per_step)
    rows.insert(db)
    faults = _um_faults(db) if schema != "2020" and um else {"cpu": 0, "gpu": 0}
    db.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in rows.strings.items()])
    db.commit()
    db.close()
    out = rows.exp.as_dict()
    out["busy_intervals"] = {d: v for d, v in rows.busy.items()}
    out["um_faults"] = faults
    return out


def _create_nsys_tables(db: sqlite3.Connection, schema: str, devices: int) -> None:
    """The tables of one schema generation, with its metadata, enum tables and GPU rows."""
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


_COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP", 11: "UM_HtoD", 12: "UM_DtoH"}


class _NsysRows:
    """The activity rows of an nsys export as the steps produce them, and the totals device 0 must show."""

    def __init__(self, rng: random.Random, schema: str, devices: int, um: bool):
        self.rng, self.schema, self.devices, self.um = rng, schema, devices, um
        self.exp = _Expect()
        self.strings: dict[str, int] = {}
        self.busy: dict[int, list] = defaultdict(list)
        self.kernels, self.copies, self.memsets, self.nvtx = [], [], [], []
        self.t = 1_000_000
        self.gpu_t: dict[int, int] = {}

    def sid(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings) + 1)

    def step(self, step: int, kernels_per_step: int) -> None:
        step_start, schema = self.t, self.schema
        self.gpu_t = {d: self.t + 10_000 for d in range(self.devices)}
        for _ in range(kernels_per_step):
            for d in range(self.devices):
                s = self.kernel(d)
                if self.rng.random() < 0.1:
                    self.copy(d, s)
                if schema != "2020" and self.rng.random() < 0.05:
                    self.memset(d)
        t = self.t = max(self.gpu_t.values()) + 5_000
        self.exp.steps[step] = t - step_start
        self.nvtx.append((step_start, t, 59, None, f"ProfilerStep#{step}", 0, None, 0) if schema != "2020"
                         else (step_start, t, 59, None, f"ProfilerStep#{step}", 0))
        if schema != "2020":
            # A start/end range whose text lives in StringIds, in the "Training" domain.
            self.nvtx.append((step_start + 1_000, t - 1_000, 60, step, None, 0, self.sid("forward_backward"), 7))
        self.t += 20_000

    def kernel(self, d: int) -> int:
        """A kernel on device d; returns its start."""
        rng, sid, exp = self.rng, self.sid, self.exp
        name, cat = KERNELS[rng.randrange(len(KERNELS))]
        short = name.split("(")[0].split("<")[0].replace("void ", "")
        dur = rng.randint(1_000, 300_000)
        s = self.gpu_t[d]
        cols = [s, s + dur, d, 1]
        if self.schema == "2024":
            cols += [None, 7, 0, 0, sid(name), sid(short), sid("_Z" + short), 0, 64, 132, 1, 1, None]
        elif self.schema == "2022":
            cols += [7, 0, 0, sid(name), sid(short), None, 64]
        else:
            cols += [7, 0, sid(name), sid(short)]
        self.kernels.append(cols)
        self.busy[d].append((s, s + dur))
        if d == 0:
            exp.kernels += 1
            exp.kernel_ns += dur
            exp.kernel_ns_by_category[cat] += dur
        self.gpu_t[d] = s + dur + rng.randint(100, 30_000)
        return s

    def copy(self, d: int, kernel_start: int) -> None:
        rng = self.rng
        kind = rng.choice([1, 2, 8, 10] + ([11, 12] if self.um else []))
        nbytes, cdur = rng.randint(1, 1 << 24), rng.randint(500, 90_000)
        src, dst = {1: (1, 2), 2: (2, 0), 11: (4, 2), 12: (2, 4)}.get(kind, (2, 2))
        # UM migrations overlap kernels on their own engine.
        cs = self.gpu_t[d] if kind < 11 else kernel_start
        row = [cs, cs + cdur, d, 1, 20, nbytes, kind, src, dst, 2 if kind >= 11 else None]
        self.copies.append(row + ([None] if self.schema == "2022" else []))
        if kind < 11:
            self.gpu_t[d] = cs + cdur + 1_000
        if d == 0:
            c = self.exp.copies[_COPY_KINDS[kind]]
            c[0] += 1; c[1] += nbytes; c[2] += cdur

    def memset(self, d: int) -> None:
        nbytes = self.rng.randint(4, 1 << 20)
        self.memsets.append((self.gpu_t[d], self.gpu_t[d] + 2_000, d, 1, 7, 0, nbytes, 2))
        self.gpu_t[d] += 3_000
        if d == 0:
            self.exp.memsets[0] += 1; self.exp.memsets[1] += nbytes

    def insert(self, db: sqlite3.Connection) -> None:
        db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * len(self.kernels[0]))})",
                       self.kernels)
        if self.copies:
            db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES ({','.join('?' * len(self.copies[0]))})",
                           self.copies)
        if self.memsets:
            db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?,?,?,?,?,?,?,?)", self.memsets)
        db.executemany(f"INSERT INTO NVTX_EVENTS VALUES ({','.join('?' * len(self.nvtx[0]))})", self.nvtx)


def _um_faults(db: sqlite3.Connection) -> dict[str, int]:
    """Seven CPU and seven GPU page-fault events (three faults each on the GPU side)."""
    for i in range(7):
        db.execute("INSERT INTO CUDA_UM_CPU_PAGE_FAULT_EVENTS VALUES (?, 1, 4096, 0, 0)", (1_000_000 + i * 10,))
        db.execute("INSERT INTO CUDA_UM_GPU_PAGE_FAULT_EVENTS VALUES (?, ?, 1, 0, 8192, 3, 1)",
                   (1_000_000 + i * 10, 1_000_500 + i * 10))
    return {"cpu": 7, "gpu": 21}


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
