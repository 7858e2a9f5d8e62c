"""Importers on synthetic files: nsys schema generations, Kineto old/new/gzip,
chunk boundaries of the streaming reader, and `nsys stats` CSV variants."""

from __future__ import annotations

import gzip
import json
import sqlite3

import pytest

from ghsim.errors import GhsimError
from ghsim.traces import load_trace, summarize
from ghsim.traces import jsonstream
from ghsim.traces.kineto import load_kineto, memcpy_kind, us_to_ns
from synthetic_traces import write_kineto, write_nsys_sqlite


def _copies(t, device=0) -> dict[str, tuple[int, int, int]]:
    c = t.memcpys[t.memcpys["device"] == device]
    g = c.groupby("kind", observed=True).agg(n=("bytes", "size"), b=("bytes", "sum"), t=("dur_ns", "sum"))
    return {k: (int(r.n), int(r.b), int(r.t)) for k, r in g.iterrows()}


# -- nsys SQLite schema generations ------------------------------------------------


@pytest.mark.parametrize("schema", ["2024", "2022", "2020"])
def test_nsys_schema_generations(tmp_path, schema):
    path = tmp_path / "run.sqlite"
    exp = write_nsys_sqlite(path, schema=schema)
    t = load_trace(path)
    k0 = t.kernels[t.kernels["device"] == 0]
    assert len(k0) == exp["kernels"] and int(k0["dur_ns"].sum()) == exp["kernel_ns"]
    assert _copies(t) == exp["copies"]
    m0 = t.memsets[t.memsets["device"] == 0]
    assert (len(m0), int(m0["bytes"].sum())) == exp["memsets"]
    steps = dict(zip(t.steps["step"], t.steps["end_ns"] - t.steps["start_ns"]))
    assert steps == exp["steps"]
    faults = t.um_faults.groupby("side", observed=True)["faults"].sum().to_dict()
    assert {s: faults.get(s, 0) for s in ("cpu", "gpu")} == exp["um_faults"]
    assert [g.id for g in t.gpus] == [0, 1]
    if schema != "2020":
        # Marks and domain registrations are not ranges; StringIds text and domains resolve.
        assert "a mark" not in set(t.nvtx["name"])
        fb = t.nvtx[t.nvtx["name"] == "forward_backward"]
        assert len(fb) == 3 and set(fb["domain"]) == {"Training"}
        htod = t.memcpys[t.memcpys["kind"] == "HtoD"]
        assert set(htod["memory"]) <= {"pinned"}


def test_nsys_um_share_and_device_choice(tmp_path):
    path = tmp_path / "um.sqlite"
    exp = write_nsys_sqlite(path, schema="2024", steps=4, devices=2)
    t = load_trace(path)
    s = summarize(t, device=0)
    um = t.memcpys[(t.memcpys["device"] == 0) & t.memcpys["kind"].isin(["UM_HtoD", "UM_DtoH"])]
    assert s.um_migration.count == len(um) and s.um_migration.bytes == int(um["bytes"].sum())
    assert 0 < s.um_migration_share < 1
    # Busy fraction from an independent union of the written intervals.
    ivs = sorted(exp["busy_intervals"][0])
    lo = min(int(t.kernels["start_ns"].min()), int(t.memcpys["start_ns"].min()), int(t.memsets["start_ns"].min()))
    hi = max(int((t.kernels["start_ns"] + t.kernels["dur_ns"]).max()),
             int((t.memcpys["start_ns"] + t.memcpys["dur_ns"]).max()),
             int((t.memsets["start_ns"] + t.memsets["dur_ns"]).max()))
    union, cur_s, cur_e = 0, None, None
    for a, b in ivs:
        if cur_e is None or a > cur_e:
            union += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    union += cur_e - cur_s
    assert s.gpu_busy_fraction == pytest.approx(union / (hi - lo), rel=1e-12)
    with pytest.raises(GhsimError, match="device 5"):
        summarize(t, device=5)


def test_nsys_unified_memory_counter_table(tmp_path):
    """Older exports: UM transfers and faults as CUPTI unified-memory counter records."""
    path = tmp_path / "old_um.sqlite"
    write_nsys_sqlite(path, schema="2020", um=False, steps=1, kernels_per_step=5)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER (start INTEGER, end INTEGER, "
               "counterKind INTEGER, value INTEGER, srcId INTEGER, dstId INTEGER, address INTEGER)")
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER VALUES (?,?,?,?,?,?,0)", [
        (1_000_000, 1_010_000, 1, 65536, 0, 0),    # HtoD, 64 KiB, onto device 0
        (1_020_000, 1_025_000, 2, 4096, 0, 0),     # DtoH
        (1_030_000, 1_031_000, 4, 3, 0, 0),        # 3 GPU page faults
        (1_030_500, 1_030_500, 3, 2, 0, 0),        # 2 CPU page faults
    ])
    db.commit(); db.close()
    t = load_trace(path)
    um = t.memcpys[t.memcpys["kind"].isin(["UM_HtoD", "UM_DtoH"])]
    assert sorted(zip(um["kind"], um["bytes"], um["dur_ns"])) == [("UM_DtoH", 4096, 5000), ("UM_HtoD", 65536, 10000)]
    assert t.um_faults.groupby("side", observed=True)["faults"].sum().to_dict() == {"cpu": 2, "gpu": 3}
    s = summarize(t)
    assert s.um_migration.bytes == 65536 + 4096 and s.um_page_faults == {"cpu": 2, "gpu": 3}


def test_nsys_missing_tables_and_empty(tmp_path):
    path = tmp_path / "x.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.commit(); db.close()
    with pytest.raises(GhsimError, match="unknown schema: no kernel table"):
        load_trace(path)
    path2 = tmp_path / "y.sqlite"
    db = sqlite3.connect(path2)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
               "streamId INTEGER, demangledName INTEGER, shortName INTEGER)")
    db.commit(); db.close()
    with pytest.raises(GhsimError, match="no GPU activity"):
        load_trace(path2)
    path3 = tmp_path / "z.sqlite"
    db = sqlite3.connect(path3)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (begin INTEGER, finish INTEGER)")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1, 2)")
    db.commit(); db.close()
    with pytest.raises(GhsimError, match="no 'start' column"):
        load_trace(path3)


def test_nsys_odd_cells_are_ghsim_errors(tmp_path):
    path = tmp_path / "odd.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, demangledName, shortName)")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ('soon', 'later', 0, 7, 1, 1)")
    db.commit(); db.close()
    with pytest.raises(GhsimError, match="unexpected value"):
        load_trace(path)


@pytest.mark.parametrize("start,end,match", [
    (100, 50, "1 rows end before they start"),
    (100, 2**63 - 1, "outside any plausible time"),
    (-5, 10, "outside any plausible time"),
])
def test_nsys_damaged_spans_are_refused(tmp_path, start, end, match):
    """A kernel or copy ending before it starts, or at INT64_MAX, is a damaged export: it is
    named, not clamped to zero or summed into a 292-year step."""
    for table, columns, row in (
        ("CUPTI_ACTIVITY_KIND_KERNEL", "start, end, deviceId, streamId, demangledName, shortName", (0, 7, 1, 1)),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "start, end, deviceId, streamId, bytes, copyKind", (0, 7, 64, 1)),
    ):
        path = tmp_path / f"{table}.sqlite"
        db = sqlite3.connect(path)
        db.execute(f"CREATE TABLE {table} ({columns})")
        db.execute(f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?)", (start, end, *row))
        db.commit(); db.close()
        with pytest.raises(GhsimError, match=match) as err:
            load_trace(path)
        assert table in str(err.value) and "\n" not in str(err.value)


# -- Kineto ---------------------------------------------------------------------------------


@pytest.mark.parametrize("new_format,gz", [(True, False), (False, False), (True, True), (False, True)])
def test_kineto_formats_round_trip(tmp_path, new_format, gz):
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    exp = write_kineto(path, steps=4, kernels_per_step=30, new_format=new_format, gz=gz, seed=3)
    t = load_trace(path)
    assert len(t.kernels) == exp["kernels"] and int(t.kernels["dur_ns"].sum()) == exp["kernel_ns"]
    assert _copies(t) == exp["copies"]
    assert (len(t.memsets), int(t.memsets["bytes"].sum())) == exp["memsets"]
    assert dict(zip(t.steps["step"], t.steps["end_ns"] - t.steps["start_ns"])) == exp["steps"]
    assert t.memory_peaks() == {0: exp["memory_peak"]}
    s = summarize(t)
    for cat, ns in exp["kernel_ns_by_category"].items():
        assert s.kernel_time_by_category_s[cat] == pytest.approx(ns / 1e9, rel=1e-12)
    assert t.gpus[0].sm_count == 132


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_stream_chunk_boundaries(tmp_path, monkeypatch, chunk):
    path = tmp_path / "t.json"
    exp = write_kineto(path, steps=2, kernels_per_step=6, seed=1)
    monkeypatch.setattr(jsonstream, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(jsonstream, "_LOW_WATER", min(chunk, 16))
    t = load_kineto(path)
    assert len(t.kernels) == exp["kernels"] and int(t.kernels["dur_ns"].sum()) == exp["kernel_ns"]
    assert dict(zip(t.steps["step"], t.steps["end_ns"] - t.steps["start_ns"])) == exp["steps"]


def test_kineto_bare_array_and_header_after_events(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 10,
               "dur": 5, "args": {"device": 0, "stream": 7}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "pid": 1, "tid": 9,
               "ts": 20, "dur": 2, "args": {"device": 1, "stream": 9, "bytes": 100}}]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events))
    t = load_trace(bare)
    assert t.kernels["start_ns"].tolist() == [10_000] and t.memcpys["kind"].tolist() == ["PtoP"]
    late = tmp_path / "late.json"
    late.write_text(json.dumps({"traceEvents": [dict(events[0], ts=1.5, dur=0.25)], "baseTimeNanoseconds": 1000}))
    t = load_trace(late)
    assert t.kernels["start_ns"].tolist() == [2_500] and t.kernels["dur_ns"].tolist() == [250]


def test_us_to_ns_exact():
    assert us_to_ns(1) == 1000
    assert us_to_ns("4458676524670.502") == 4_458_676_524_670_502
    assert us_to_ns("0.5") == 500 and us_to_ns("-1.25") == -1250
    assert us_to_ns("1.5e3") == 1_500_000 and us_to_ns("2.0004") == 2000
    for bad in ("NaN", "Infinity", "abc", None, True, [1]):
        with pytest.raises((ValueError, TypeError, ArithmeticError)):
            us_to_ns(bad)


def test_memcpy_names():
    assert memcpy_kind("Memcpy HtoD (Pinned -> Device)") == ("HtoD", "pinned")
    assert memcpy_kind("Memcpy DtoH (Device -> Pageable)") == ("DtoH", "pageable")
    assert memcpy_kind("Memcpy DtoD (Device -> Device)") == ("DtoD", "device")
    assert memcpy_kind("Memcpy PtoP (Device -> Device)") == ("PtoP", "device")
    assert memcpy_kind("Memcpy HtoD") == ("HtoD", "unknown")
    assert memcpy_kind("something else") == ("other", "unknown")


@pytest.mark.parametrize("text,match", [
    ('', "empty file"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]}', "no GPU activity"),
    ('{"schemaVersion": 1}', "no traceEvents"),
    ('{"traceEvents": 5}', "not an array"),
    ('{"traceEvents": [5]}', "not an object"),
    ('{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 1}]}', "malformed kernel event"),
    ('{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 1, "dur": -4}]}', "negative duration"),
    ('{"traceEvents": [{"cat": "kernel", "name": "k", "ts": "x", "dur": 1}]}', "'x' is not a number of microseconds"),
    ('{"traceEvents": [{"cat": "kernel", "name": "k", "ts": "NaN", "dur": 1}]}', "not a finite number"),
    ('{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 1}]}', "no 'dur' field"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1, "dur": 1}], "baseTimeNanoseconds": "x"}', "baseTimeNanoseconds"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1e300, "dur": 1}]}', "kernel"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1, "dur": 1}]} trailing', "extra data"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1, "dur": 1} {"cat": "kernel"}]}', "expected ','"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1, "dur": 1}', "cut off"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1, "du', "cut off"),
    ('{"traceEvents": [' + "[" * 100000 + "]" * 100000 + "]}", "nested too deeply|not an object"),
    ('{"traceEvents": [{"cat": "kernel", "ts": 1' + "0" * 5000 + ', "dur": 1}]}', "invalid JSON"),
    ("nope", "unrecognised trace format"),
])
def test_kineto_errors(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(GhsimError, match=match) as err:
        load_trace(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_truncated_gzip_message(tmp_path):
    path = tmp_path / "t.json.gz"
    write_kineto(path, gz=True, steps=2, kernels_per_step=50)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(GhsimError, match="truncated gzip"):
        load_trace(path)
    path.write_bytes(data[:-6])  # the stream is whole, the trailer (CRC, size) is not
    with pytest.raises(GhsimError, match="truncated gzip|cut off"):
        load_trace(path)


def test_json_cut_off_names_the_byte(tmp_path):
    path = tmp_path / "t.json"
    write_kineto(path, steps=1, kernels_per_step=5)
    data = path.read_bytes()
    path.write_bytes(data[:1234])
    with pytest.raises(GhsimError, match=r"JSON cut off at byte 1234"):
        load_trace(path)


# -- nsys stats CSV -----------------------------------------------------------------------------

KERN_2023 = ('Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n'
             '60.0,6000000,100,60000.0,60000,50000,70000,100.0,"nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT"\n'
             '30.0,3000000,50,60000.0,60000,50000,70000,100.0,"void pytorch_flash::flash_fwd_kernel<X>(Flash_fwd_params)"\n'
             '10.0,1000000,10,100000.0,100000,90000,110000,100.0,"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"\n')
MEMTIME_2023 = ('Time (%),Total Time (ns),Count,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Operation\n'
                '70.0,3000000,2,1500000.0,1500000,1,2,0.0,[CUDA memcpy Host-to-Device]\n'
                '20.0,2000000,1,2000000.0,2000000,1,2,0.0,[CUDA memcpy Device-to-Host]\n'
                '5.0,500000,4,1.0,1.0,1,2,0.0,[CUDA memcpy Unified Host-to-Device]\n'
                '0.0,1000,1,1000.0,1000,1000,1000,0.0,[CUDA memset]\n')
MEMSIZE_2023 = ('Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n'
                '16.000,2,8.000,8.000,8.000,8.000,0.000,[CUDA memcpy Host-to-Device]\n'
                '0.004,1,0.004,0.004,0.004,0.004,0.000,[CUDA memcpy Device-to-Host]\n'
                '8.389,4,2.097,2.097,2.097,2.097,0.000,[CUDA memcpy Unified Host-to-Device]\n'
                '1.000,1,1.000,1.000,1.000,1.000,0.000,[CUDA memset]\n')
KERN_2021 = ('Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,StdDev,Name\n'
             '75.0,"7500",3,2500.0,2000,3000,100.0,ampere_sgemm_128x64_tn\n'
             '25.0,"2500",1,2500.0,2500,2500,0.0,"void at::native::vectorized_elementwise_kernel<4>(int)"\n')
MEMSIZE_2021 = ('Total,Operations,Average,Minimum,Maximum,StdDev,Operation\n'
                '1024.000,2,512.000,512.000,512.000,0.000,[CUDA memcpy HtoD]\n'
                '2.000,1,2.000,2.000,2.000,0.000,[CUDA memcpy PtoP]\n')
MEMTIME_2021 = ('Time(%),Total Time (ns),Operations,Average,Minimum,Maximum,StdDev,Operation\n'
                '90.0,9000,2,4500.0,4000,5000,0.0,[CUDA memcpy HtoD]\n'
                '10.0,1000,1,1000.0,1000,1000,0.0,[CUDA memcpy PtoP]\n')


def test_stats_csv_sibling_reports(tmp_path):
    (tmp_path / "rep_cuda_gpu_kern_sum.csv").write_text(KERN_2023)
    (tmp_path / "rep_cuda_gpu_mem_time_sum.csv").write_text(MEMTIME_2023)
    (tmp_path / "rep_cuda_gpu_mem_size_sum.csv").write_text(MEMSIZE_2023)
    t = load_trace(tmp_path / "rep_cuda_gpu_kern_sum.csv")
    assert not t.has_timeline and t.format == "nsys-stats-csv"
    assert int(t.kernels["dur_ns"].sum()) == 10_000_000 and int(t.kernels["count"].sum()) == 160
    s = summarize(t)
    assert s.kernel_share_by_category == pytest.approx({"gemm": 0.6, "attention": 0.3, "elementwise": 0,
                                                        "norm_reduction": 0, "optimizer": 0,
                                                        "communication": 0.1, "other": 0})
    assert s.memcpy["HtoD"].bytes == 16_000_000 and s.memcpy["HtoD"].time_s == pytest.approx(0.003)
    assert s.memcpy["HtoD"].count == 2 and s.memcpy["DtoH"].bytes == 4000
    assert s.um_migration.bytes == 8_389_000 and s.um_migration.count == 4
    assert s.memset.bytes == 1_000_000 and s.memset.count == 1
    assert s.gpu_busy_fraction is None and s.idle_gaps is None and s.um_migration_share is None
    assert s.step_times_s == ()
    assert any("no timeline" in n for n in s.notes)
    assert s.top_kernels[0].count == 100
    with pytest.raises(GhsimError, match="aggregate-only"):
        summarize(t, steps="1-2")


def test_stats_csv_concatenated_stdout_old_names(tmp_path):
    text = ("Processing [run.sqlite] with [/opt/nsys/reports/gpukernsum.py]...\n\n"
            " ** CUDA GPU Kernel Summary (gpukernsum):\n\n" + KERN_2021 + "\n"
            "Processing [run.sqlite] with [/opt/nsys/reports/gpumemsizesum.py]...\n\n"
            " ** CUDA GPU MemOps Summary (by Size) (gpumemsizesum):\n\n" + MEMSIZE_2021 + "\n"
            " ** CUDA GPU MemOps Summary (by Time) (gpumemtimesum):\n\n" + MEMTIME_2021)
    path = tmp_path / "stats.txt"
    path.write_text(text)
    t = load_trace(path)
    s = summarize(t)
    assert s.kernel_time_s == pytest.approx(10e-6)
    assert s.kernel_share_by_category["gemm"] == pytest.approx(0.75)
    assert s.memcpy["HtoD"].bytes == 1024 * 1024 and s.memcpy["HtoD"].count == 2  # KiB in old reports
    assert s.memcpy["PtoP"].bytes == 2048 and s.memcpy["PtoP"].time_s == pytest.approx(1e-6)


def test_stats_csv_decimal_comma_and_units(tmp_path):
    path = tmp_path / "sizes.csv"
    path.write_text('Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n'
                    '"482,333",3,"160,778","160,778","160,778","160,778","0,000",[CUDA memcpy DtoH]\n')
    s = summarize(load_trace(path))
    assert s.memcpy["DtoH"].bytes == 482_333_000 and s.kernel_time_s == 0
    path2 = tmp_path / "kern_us.csv"
    path2.write_text("Time (%),Total Time (us),Instances,Avg (us),Med (us),Min (us),Max (us),StdDev (us),Name\n"
                     "100.0,1.5,1,1.5,1.5,1.5,1.5,0.0,saxpy\n")
    assert int(load_trace(path2).kernels["dur_ns"].sum()) == 1500


@pytest.mark.parametrize("text,match", [
    ("Time (%),Total Time (ns),Num Calls,Name\n1,2,3,cudaMalloc\n", "unrecognised|no nsys stats table"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,abc,3,1,k\n", "not a number"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,2\n", "columns"),
    ("Time (%),Total Time (parsecs),Instances,Name\n1,2,3,k\n", "unknown time unit"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n", "no GPU activity"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,nan,3,1,k\n", "not a finite number"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,inf,3,1,k\n", "not a finite number"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,-20,3,1,k\n", "row 1: negative value"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,20,-3,1,k\n", "row 1: negative value"),
    ("Time (%),Total Time (s),Instances,Avg (ns),Name\n1,1e12,3,1,k\n", "implausible value"),
    ("Time (%),Total Time (ns),Count,Avg (ns),Operation\n1,-5,3,1,[CUDA memcpy HtoD]\n", "negative value"),
    ("Time (%),Total Time (ns),Instances,Avg (ns),Name\n1,2,3,1,\"" + "k" * 200_000 + "\"\n", "malformed CSV"),
])
def test_stats_csv_errors(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(GhsimError, match=match):
        load_trace(path)


def test_loader_errors(tmp_path):
    with pytest.raises(GhsimError, match="no such file"):
        load_trace(tmp_path / "missing.sqlite")
    with pytest.raises(GhsimError, match="is a directory"):
        load_trace(tmp_path)
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00binary")
    with pytest.raises(GhsimError, match="nsys export --type sqlite"):
        load_trace(rep)
    fake = tmp_path / "fake.sqlite"
    fake.write_bytes(b"hello, world\x00\x01")
    with pytest.raises(GhsimError, match="not an SQLite database"):
        load_trace(fake)
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(GhsimError, match="empty file"):
        load_trace(empty)
    zipped_garbage = tmp_path / "g.json.gz"
    zipped_garbage.write_bytes(gzip.compress(b"\x00\x01\x02 not json"))
    with pytest.raises(GhsimError, match="invalid JSON|a trace must be"):
        load_trace(zipped_garbage)
    bad_crc = bytearray(gzip.compress(b'{"traceEvents": []}'))
    bad_crc[-8] ^= 0xFF
    (tmp_path / "crc.json.gz").write_bytes(bytes(bad_crc))
    with pytest.raises(GhsimError, match="corrupt compressed data|no GPU activity"):
        load_trace(tmp_path / "crc.json.gz")
