"""GH200 node kinds (issue 16, item 3): a single-superchip profile asked for a 4-GPU node.

gh200-96gb is one superchip per node (nodes on InfiniBand); gh200-96gb-quad is the quad node
(four superchips, NVLink between the GPUs). --gpus-per-node 4 on gh200-96gb means the quad
node; --gpus 4 alone means four single-superchip nodes, and a note names the quad profile.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware, node_profile_for
from ghsim.model import load_model
from ghsim.plan import Plan
from synthetic import TINY_MODEL_TOML


def test_four_gpus_per_node_on_the_single_superchip_profile_reads_as_the_quad_node():
    choice = node_profile_for(load_hardware("gh200-96gb"), gpus=4, gpus_per_node=4)
    assert choice.hardware.name == "gh200-96gb-quad"
    assert "gh200-96gb-quad" in choice.note and "\n" not in choice.note


def test_several_single_superchip_nodes_stay_nodes_and_the_note_names_the_quad_profile():
    hw = load_hardware("gh200-96gb")
    choice = node_profile_for(hw, gpus=4, gpus_per_node=0)
    assert choice.hardware is hw
    assert "--hardware gh200-96gb-quad" in choice.note
    assert node_profile_for(hw, gpus=1, gpus_per_node=0).note is None


def test_profiles_without_a_bigger_node_are_kept_silently_or_refused_in_one_line():
    h100 = load_hardware("h100-sxm")
    assert node_profile_for(h100, gpus=8, gpus_per_node=0).note is None
    with pytest.raises(GhsimError, match="exceeds the 8 GPU"):
        node_profile_for(h100, gpus=16, gpus_per_node=16)
    with pytest.raises(GhsimError, match="gh200-96gb-quad"):  # larger than the quad node too
        node_profile_for(load_hardware("gh200-96gb"), gpus=8, gpus_per_node=8)


def test_the_layout_check_names_the_quad_profile():
    from ghsim.simulate import simulate

    with pytest.raises(GhsimError, match="--hardware gh200-96gb-quad"):
        simulate(load_model("llama-3-8b"), load_hardware("gh200-96gb"),
                 Plan(gpus=4, gpus_per_node=4, seq=1024, zero=3))


def test_simulate_cli_takes_the_quad_node_with_one_note_and_clean_json():
    r = CliRunner().invoke(main, ["simulate", "--model", "llama-3-8b", "--hardware", "gh200-96gb", "--gpus", "4",
                                  "--gpus-per-node", "4", "--zero", "3", "--seq", "1024", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)  # nothing else on stdout or stderr
    assert "reads as gh200-96gb-quad" in report["notes"][0]
    assert sum("gh200-96gb-quad" in n for n in report["notes"]) == 1
    assert report["hardware"]["name"] == "gh200-96gb-quad"
    assert "1 node(s) of 4 GPUs" in " ".join(report["notes"])


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny-llama.toml"
    path.write_text(TINY_MODEL_TOML)
    return str(path)


def test_plan_cli_finds_plans_on_the_quad_node_instead_of_saying_no_plan_fits(tiny_model_path):
    # Before: every plan the memory model let through was rejected for the node size, and the
    # advice said "no plan fits ... try 8 x gh200-96gb" although a small plan fits in 96 GB.
    r = CliRunner().invoke(main, ["plan", "--model", tiny_model_path, "--hardware", "gh200-96gb", "--gpus", "4",
                                  "--gpus-per-node", "4", "--seq", "1024", "--precision", "bf16", "--recompute",
                                  "full", "--cuda-graphs", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert "no plan fits" not in r.output
    out = json.loads(r.output)
    assert out["n_feasible"] > 0 and "gh200-96gb-quad" in out["node_note"]


def test_no_fit_advice_reports_a_layout_error_not_memory_advice():
    from ghsim.search.explain import no_fit_advice
    from ghsim.search.screen import Evaluation, Status

    hw = load_hardware("gh200-96gb")
    model = load_model("llama-3-8b")
    base = Plan(gpus=4, gpus_per_node=4, seq=1024)
    reason = "--gpus-per-node 4 exceeds the 1 GPU(s) a gh200-96gb node has"

    class Result:  # the fields no_fit_advice reads
        pass

    r = Result()
    r.model, r.hardware, r.base = model, hw, base
    r.evaluations = [Evaluation(plan=base, status=Status.REJECTED, reason=reason)]
    advice = no_fit_advice(r)
    assert advice[0].startswith("no plan could be simulated") and reason in advice[0]
    assert not any("no plan fits" in line for line in advice)


def test_hardware_listing_names_node_size_and_assumed_figures():
    from ghsim.hardware import assumed_figures

    gh = assumed_figures(load_hardware("gh200-96gb"))
    assert "unified_memory.migration_gbps" in gh and "host_link.h2d_pinned_gbps" not in gh
    out = CliRunner().invoke(main, ["hardware"]).output
    quad = next(line for line in out.splitlines() if line.startswith("gh200-96gb-quad"))
    assert "4 GPU(s)/node" in quad and "assumed: " in quad and "unified_memory.migration_gbps" in quad
    assert "host path x2.46" in quad  # Grace's launch path against the calibration's x86 host
    assert "TP call 123.5 us" in quad  # and its seconds per tensor-parallel collective call
    assert "TP call" not in next(line for line in out.splitlines() if line.startswith("h100-sxm"))  # not measured


def test_no_fit_advice_names_the_other_node_kind_and_what_changes():
    from ghsim.search.explain import _fixes

    model = load_model("llama-3.1-405b")
    for name, other in (("gh200-96gb", "gh200-96gb-quad"), ("gh200-96gb-quad", "gh200-96gb")):
        fixes = _fixes(model, load_hardware(name), Plan(gpus=8, seq=4096))
        line = next(f for f in fixes if f.startswith(f"--hardware {other}:"))
        assert "GB of host memory per node" in line and "per GPU" in line and "fit" in line
