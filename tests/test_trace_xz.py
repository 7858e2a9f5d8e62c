"""Committed traces may be xz-compressed (a third smaller than gzip): read alike, damage named."""

import gzip
import lzma
from pathlib import Path

import pytest

from ghsim.errors import GhsimError
from ghsim.traces import load_trace, summarize

CASE = Path(__file__).resolve().parents[1] / "validation" / "measured_libraries" / "h100-ds-z2-llama3b-ckpt-mb2-s2048"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same Kineto trace as gzip and as xz."""
    tmp = tmp_path_factory.mktemp("xz")
    text = lzma.open(CASE / "trace.pt.trace.json.xz").read()
    gz, xz = tmp / "t.json.gz", tmp / "t.json.xz"
    gz.write_bytes(gzip.compress(text))
    xz.write_bytes(lzma.compress(text))
    return gz, xz


def test_xz_reads_as_gzip(pair):
    gz, xz = (summarize(load_trace(p)) for p in pair)
    assert dict(xz.kernel_time_by_category_s) == dict(gz.kernel_time_by_category_s)
    assert (xz.kernel_count, xz.gpu_busy_fraction, xz.memcpy) == (gz.kernel_count, gz.gpu_busy_fraction, gz.memcpy)
    assert xz.kernel_count > 1000


def test_truncated_xz_is_named(pair, tmp_path):
    cut = tmp_path / "cut.json.xz"
    cut.write_bytes(pair[1].read_bytes()[:50_000])
    with pytest.raises(GhsimError, match="truncated gzip or xz"):
        summarize(load_trace(cut))
