"""Model inputs (issue 17 items 2, 9, 14): Hugging Face config.json per architecture, checked
against published parameter totals; the catalog's names; bad model files refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.model import MlpKind, NormKind, catalog, load_model, simulator_gap

HF = Path(__file__).parent / "data" / "hf_configs"

# (config, published total, published active or None, what the active figure leaves out, source)
PUBLISHED = [
    # DeepSeek-V3 technical report (arXiv:2412.19437), abstract: 671B total, 37B activated per token
    ("deepseek-v3", 671e9, 37e9, "", 0.01),
    # DeepSeek-V2 paper (arXiv:2405.04434) Sec. 4 / model card: V2-Lite 15.7B total, 2.4B activated
    # (the activated count leaves the input embedding out, a lookup)
    ("deepseek-v2-lite", 15.7e9, 2.4e9, "embedding", 0.03),
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B total, 12.9B per token
    ("mixtral-8x7b", 46.7e9, 12.9e9, "", 0.01),
    # Gemma technical report (arXiv:2403.08295) Table 2: 7B model, 8.54B parameters (7.75B non-embedding)
    ("gemma-7b", 8.54e9, None, "", 0.005),
    # Gemma 2 technical report (arXiv:2408.00118) Table 2: 9B model, 9.24B total (8.32B non-embedding)
    ("gemma-2-9b", 9.24e9, None, "", 0.005),
    # Hugging Face microsoft/phi-2 safetensors metadata: 2,779,683,840 parameters ("2.7B" on the card)
    ("phi-2", 2.7797e9, None, "", 0.001),
    # Phi-3 technical report (arXiv:2404.14219): phi-3-mini, 3.8B parameters
    ("phi-3-mini-4k", 3.82e9, None, "", 0.01),
    # Qwen2.5-7B model card: 7.61B parameters (6.53B non-embedding)
    ("qwen2.5-7b", 7.61e9, None, "", 0.005),
    # Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, "", 0.01),
    # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "", 0.02),
    # gpt-oss model card (OpenAI, 2025-08-05) Table 1: 116.83B total, 5.13B active (active: no input embedding)
    ("gpt-oss-120b", 116.83e9, 5.13e9, "embedding", 0.005),
    # Meta Llama 3.1 model card: 8B (8.03B in the safetensors metadata)
    ("llama-3.1-8b", 8.03e9, None, "", 0.005),
    # Mistral-7B paper (arXiv:2310.06825): 7.3B (7.24B in the safetensors metadata)
    ("mistral-7b-v0.1", 7.24e9, None, "", 0.005),
]


@pytest.mark.parametrize("config,total,active,excluded,tol", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_hf_config_parameter_counts_match_published(config, total, active, excluded, tol):
    m = load_model(str(HF / f"{config}.json"))
    assert m.total_params == pytest.approx(total, rel=tol)
    if active is not None:
        counted = m.active_params_per_token - (m.embedding_params if excluded == "embedding" else 0)
        assert counted == pytest.approx(active, rel=max(tol, 0.02))


def test_architectures_are_read_as_themselves_not_as_llama():
    phi = load_model(str(HF / "phi-2.json"))
    assert phi.mlp == MlpKind.GELU and phi.mlp_matrices == 2 and phi.norm == NormKind.LAYERNORM
    assert phi.rotary_fraction == 0.4
    gemma = load_model(str(HF / "gemma-7b.json"))
    assert gemma.mlp == MlpKind.GEGLU and gemma.head_dim == 256 and gemma.tie_embeddings
    mistral = load_model(str(HF / "mistral-7b-v0.1.json"))
    assert mistral.sliding_window == 4096
    assert load_model(str(HF / "qwen2.5-7b.json")).sliding_window == 0  # use_sliding_window false
    v3 = load_model(str(HF / "deepseek-v3.json"))
    assert v3.mla is not None and v3.mla.kv_lora_rank == 512
    assert v3.moe.dense_layers == 3 and v3.moe.shared_intermediate_size == 2048
    assert simulator_gap(v3) is not None


def test_catalog_models_agree_with_their_hf_configs():
    for name, config in (("deepseek-v3", "deepseek-v3"), ("gpt-oss-120b", "gpt-oss-120b"),
                         ("qwen2.5-7b", "qwen2.5-7b"), ("llama-3.1-8b", "llama-3.1-8b"),
                         ("mixtral-8x7b", "mixtral-8x7b")):
        a, b = load_model(name), load_model(str(HF / f"{config}.json"))
        assert a.total_params == b.total_params, name
        assert a.active_params_per_token == b.active_params_per_token, name


def _cli(args):
    r = CliRunner().invoke(main, args, standalone_mode=False)
    return r.exit_code, r.output


def test_model_folder_is_accepted(tmp_path):
    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    shutil.copy(HF / "qwen2.5-7b.json", folder / "config.json")
    m = load_model(str(folder))
    assert m.name == "Qwen2.5-7B" and m.total_params == pytest.approx(7.61e9, rel=0.005)
    with pytest.raises(GhsimError, match="must hold a Hugging Face config.json"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("config,what", [("falcon-7b", "architecture 'falcon' is not modeled")])
def test_unmodeled_architecture_is_refused_in_one_line(config, what):
    with pytest.raises(GhsimError, match=what) as e:
        load_model(str(HF / f"{config}.json"))
    assert "\n" not in str(e.value)


def test_simulating_an_unmodeled_feature_is_one_line_exit_2():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "ghsim.cli", "simulate", "--model", str(HF / "deepseek-v3.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "multi-head latent attention" in r.stderr
    assert "Traceback" not in r.stderr


# --- item 14: names ---------------------------------------------------------------------------

def test_models_lists_every_accepted_name():
    code, out = _cli(["models"])
    assert code == 0
    for name in catalog():
        assert name in out, name
    for wanted in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-7b", "gpt-oss-120b", "deepseek-v3"):
        assert wanted in catalog()


def test_names_are_case_insensitive():
    assert load_model("Llama-3.1-8B") == load_model("llama-3.1-8b")
    assert load_model("LLAMA-70B").name == "llama-3-70b"


def test_unknown_name_suggests_instead_of_listing():
    with pytest.raises(GhsimError) as e:
        load_model("llama-3.1-8")
    msg = str(e.value)
    assert msg.startswith("unknown model 'llama-3.1-8'; did you mean 'llama-3.1-8b'")
    assert "\n" not in msg and "gpt3-1t" not in msg


def test_bare_ghsim_prints_help_and_exits_0():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "ghsim.cli"], capture_output=True, text=True)
    assert r.returncode == 0 and "Usage:" in r.stdout and "simulate" in r.stdout and not r.stderr


@pytest.mark.parametrize("command", [["simulate"], ["plan", "--gpus", "8", "--time-limit", "5"],
                                     ["compare", "--hardware", "h100-sxm", "--hardware", "gh200-96gb"]])
def test_every_command_refuses_an_unmodeled_model_up_front(command):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "ghsim.cli", command[0], "--model", "deepseek-v3", *command[1:]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "multi-head latent attention" in r.stderr and not r.stdout.strip()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(catalog())), st.data())
def test_every_accepted_name_in_any_case_loads_its_model(name, data):
    cased = "".join(c.upper() if data.draw(st.booleans()) else c for c in name)
    assert load_model(cased) == load_model(catalog()[name].stem)
