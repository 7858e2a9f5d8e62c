"""The layers of DESIGN.md, checked on every module's imports (parsed, not run).

inputs (model, hardware, plan) -> graph -> cost -> sim -> simulate/report: a
module imports from layers below it, never above. graph/ says what work an op
does and knows no prices and no links (no cost/, no sim/); cost/ prices ops and
runs nothing (no sim/); the engine knows nothing of ghsim at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ghsim"

# Imports that break a rule today and are to be removed; each is a (module, imported) pair.
# The test fails when one is gone, so that the list only shrinks.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()

# Layers above graph/, cost/ and sim/: what runs or presents a simulation, whatever package it lives in.
ABOVE_SIM = ("ghsim.simulate", "ghsim.plan_build", "ghsim.report", "ghsim.search", "ghsim.cli", "ghsim.validate",
             "ghsim.compare")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module `path` imports, at the top, inside functions or under TYPE_CHECKING;
    `modules`: the package's own, to tell `from ghsim.sim import engine` (a module) from
    `from ghsim.sim.memory import TierPeak` (a name in one)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return found


def _all_imports() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


IMPORTS = _all_imports()


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations() -> set[tuple[str, str]]:
    bad = set()
    for module, imported in IMPORTS.items():
        for name in (n for n in imported if _within(n, "ghsim")):
            if _within(module, "ghsim.graph") and (_within(name, "ghsim.cost") or _within(name, "ghsim.sim")):
                bad.add((module, name))
            if _within(module, "ghsim.cost") and _within(name, "ghsim.sim"):
                bad.add((module, name))
            if module == "ghsim.sim.engine":
                bad.add((module, name))
            if any(_within(module, layer) for layer in ("ghsim.graph", "ghsim.cost", "ghsim.sim")) \
                    and any(name.startswith(above) for above in ABOVE_SIM):
                bad.add((module, name))
    return bad


def test_the_parser_sees_the_package():
    assert "ghsim.graph.ops" in IMPORTS and "ghsim.sim.engine" in IMPORTS
    assert "ghsim.graph.ops" in IMPORTS["ghsim.cost.compute"]  # cost reads ops: allowed, and seen


def test_layers_import_only_downwards():
    unexpected = _violations() - KNOWN_EXCEPTIONS
    assert not unexpected, "imports against the layers (DESIGN.md):\n" + "\n".join(
        f"  {m} imports {n}" for m, n in sorted(unexpected))


@pytest.mark.parametrize("exception", sorted(KNOWN_EXCEPTIONS))
def test_known_exceptions_still_exist(exception):
    """A fixed exception must leave KNOWN_EXCEPTIONS, so the rule tightens."""
    assert exception in _violations(), f"{exception[0]} no longer imports {exception[1]}: remove it from the list"


def test_engine_knows_nothing_of_ghsim():
    assert not {n for n in IMPORTS["ghsim.sim.engine"] if _within(n, "ghsim")}


# the simulator and the pipeline run it builds for it: the only modules that run the engine
ENGINE_RUNNERS = {"ghsim.simulate", "ghsim.sim.pipeline"}


def _engine_runners() -> set[str]:
    """Modules that call engine.run / engine.run_ops (as attributes of `engine` or imported names)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id == "engine" else f.id if isinstance(f, ast.Name) else ""
                if called in ("run", "run_ops") and (isinstance(f, ast.Attribute)
                                                     or "ghsim.sim.engine" in IMPORTS[_module_name(path)]):
                    found.add(_module_name(path))
    return found - {"ghsim.sim.engine"}


def test_only_the_simulator_runs_the_engine():
    assert _engine_runners() == ENGINE_RUNNERS
