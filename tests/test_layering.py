"""DESIGN §1's import rules, read from the source with ast (nothing is imported, so a
violation cannot hide behind an import error and the check takes well under a second).

- Imports only go down the floors (``FLOORS``: control → bench → sim → serving → policies →
  engine → kernels, each package importing itself and the floors below it, never one above,
  not even inside a function); ``tui/`` imports no other package of ours and ``control/``
  imports it only inside a function (the CLI's lazy import); ``migrations/`` imports
  ``control/``, never the other way (the control plane finds the scripts without importing
  them). Every top-level package of ours is on a floor.
- ``serving/``, ``engine/``, ``policies/`` and ``kernels/`` never import the server's
  frameworks.
- Inside the tree, names come from submodules, never from a package's ``__init__``.
- Nothing of ours touches Textual's private binding state (issue 12, item 6).
- Nothing outside engine/kv_cache.py and its step transaction (engine/kv_step.py, the
  manager's one friend) touches the BlockManager's private state (its tables, chains, fill,
  ref counts...): callers use its public API (issue 12, item 1).
- The routes and the jobs hold the engine through the seam (``control.service.protocol``), never
  an implementation: no import of ``LLMEngine``, ``AsyncEngine``, ``LocalEngine``, the fleet's
  classes or their modules (issue 24).
- No module-level engine state: nothing of ours builds an engine at import time or rebinds a
  module global (``global``) (issue 24).
- The circles opened in issue 43 stay open (``NEVER_IMPORTS``): the checkpoint's parts are read
  in one module the front and the builder both use, so neither imports the other, and the
  tensor-parallel ranks are handed the builder's loader rather than importing it; not even
  inside a function or for the type checker; the checkpoint's format chooses the reader of its
  model config (``engine/model/formats.py``), the config imports none.
- No import cycle inside ``control/`` (issue 24), counting the imports made for the type
  checker: an import inside a function is the one way back up.
- The fleet's control plane loads no model code: what ``control/fleet/`` imports at module
  level never reaches the model, the runner, the kernels or the engine that wraps them,
  however indirectly (the replica class imports them inside its constructor, which runs in
  the replicas only) (issue 24).
Each rule also runs on a small tree with a deliberate violation, to show it can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOORS = ("kernels", "engine", "policies", "serving", "sim", "bench", "control")
"""The floors, bottom up: the attention kernels; the engine (KV cache, model, runner, sampler,
tenants, outputs); the scheduling policies; the step loop that drives them (``serving/``);
the simulator; the benchmarks; the control plane."""
MAY_IMPORT: dict[str, frozenset[str]] = {
    **{top: frozenset(FLOORS[: i + 1]) for i, top in enumerate(FLOORS)},
    "control": frozenset({*FLOORS, "tui"}),
    "tui": frozenset({"tui"}),
    "migrations": frozenset({"migrations", "control"}),
}
"""Which of our packages each package may import: its own floor and those below (the console
stands apart; the migrations import the control plane's models, and the control plane finds
them without an import: ``control/migrate.py``, issue 43)."""
BARE_FLOORS = ("serving", "engine", "policies", "kernels")
SERVER_FRAMEWORKS = frozenset(
    {"fastapi", "starlette", "uvicorn", "sqlmodel", "sqlalchemy", "alembic", "textual"}
    | {"apscheduler"}
)
"""What ``serving/``, ``engine/``, ``policies/`` and ``kernels/`` never import (DESIGN §1, plus the
frameworks fastapi and sqlmodel are built on)."""
PRIVATE_TEXTUAL = frozenset({"_bindings", "_merged_bindings"})
SEAM_HOLDERS = (
    "control.api",
    "control.jobs",
    "control.policy",
    "control.schedules.windows",
    "control.guardrail",
)
"""The routes, the jobs and the feature rooms: they hold the engine as an ``EngineService``."""
ENGINE_IMPLEMENTATIONS = frozenset(
    {"serving.engine", "serving.llm", "control.service.local", "control.compose"}
    | {"control.fleet.fleet", "control.fleet.client", "control.fleet.replica"}
)
ENGINE_CLASSES = frozenset(
    {"LLMEngine", "AsyncEngine", "LLM", "LocalEngine", "Fleet", "FleetEngine", "EngineReplica"}
)
MODEL_CODE = frozenset(
    {"serving.engine", "serving.llm", "engine.builder", "engine.runner", "engine.model.llama"}
    | {"engine.model.loader", "serving.async_engine", "kernels"}
)
"""What loads or runs the weights (``kernels`` with its submodules)."""
NEVER_IMPORTS: dict[str, frozenset[str]] = {
    "engine.front": frozenset({"engine.builder"}),
    "engine.builder": frozenset({"engine.front"}),
    "engine.parallel": frozenset({"engine.builder", "engine.front"}),
    "engine.model.config": frozenset(
        f"engine.model.{name}" for name in ("formats", "gguf_file", "safetensors_file", "loader")
    ),
}
"""Circles opened (issue 43): a module (with its submodules) never imports these, in any form.
``engine.checkpoint_parts`` holds what the front and the builder both read of a checkpoint;
``engine.model.formats`` chooses the reader of a model's config, so the config (a value type)
imports no file reader."""
FLEET_FRONT = "control.fleet"
KV_CACHE = Path("engine/kv_cache.py")
"""The BlockManager's home."""
KV_FRIENDS = (KV_CACHE, Path("engine/kv_step.py"))
"""The only files that may read or write the BlockManager's private state: its home and the
step transaction (``StepChanges``) that changes it within a step."""


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    """The importing module."""
    target: str
    """The module imported (from-imports: the module the names come from)."""
    names: tuple[str, ...]
    """From-imports: the names; plain imports: the target's attributes the file uses."""
    line: int
    plain: bool = False
    lazy: bool = False
    """Inside a function (runs only when called) or under ``if TYPE_CHECKING`` (never runs)."""
    in_function: bool = False
    """Inside a function: the one way a module may import what imports it."""

    def __str__(self) -> str:
        what = f"import {self.target}" if self.plain else f"from {self.target} import "
        return f"{self.source}:{self.line}: {what}{'' if self.plain else ', '.join(self.names)}"


class Tree:
    """Our packages under ``root``: module names, which are packages, and their imports."""

    def __init__(self, root: Path) -> None:
        self.files: dict[str, Path] = {}
        self.packages: set[str] = set()
        for top in MAY_IMPORT:
            for path in sorted((root / top).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                    self.packages.add(".".join(parts))
                self.files[".".join(parts)] = path
        self.imports = [i for m, path in self.files.items() for i in self._imports(m, path)]

    def _imports(self, module: str, path: Path) -> Iterator[Import]:
        package = module if module in self.packages else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        dotted = [d for d in map(_dotted, ast.walk(tree)) if d]
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
        in_function = set(lazy)
        lazy |= {id(n) for f in ast.walk(tree) if _type_checking(f) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name
                    used = {d[len(bound) + 1 :].split(".")[0] for d in dotted if _below(d, bound)}
                    names = tuple(sorted(used))
                    yield Import(
                        module,
                        alias.name,
                        names,
                        node.lineno,
                        True,
                        id(node) in lazy,
                        id(node) in in_function,
                    )
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = tuple(a.name for a in node.names)
                yield Import(
                    module,
                    target,
                    names,
                    node.lineno,
                    False,
                    id(node) in lazy,
                    id(node) in in_function,
                )

    def reached(self, imp: Import) -> set[str]:
        """The modules an import loads for what it uses: ``from serving import faults`` is
        the submodule ``serving.faults``, ``from serving import LLM`` the package itself."""
        found = {f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in self.files}
        return found | ({imp.target} if len(found) < len(imp.names) or not imp.names else set())


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) and parts else None


def _type_checking(node: ast.AST) -> bool:
    """An ``if TYPE_CHECKING:`` block: its imports are for the type checker only."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        _dotted(test) == "typing.TYPE_CHECKING"
    )


def _top(module: str) -> str:
    return module.split(".")[0]


def _below(dotted: str, prefix: str) -> bool:
    return dotted.startswith(prefix + ".")


def _under(module: str, prefixes: frozenset[str]) -> bool:
    return any(module == p or _below(module, p) for p in prefixes)


def floor_violations(tree: Tree) -> list[str]:
    found = []
    for imp in tree.imports:
        source, target = _top(imp.source), _top(imp.target)
        if target in MAY_IMPORT and target not in MAY_IMPORT[source]:
            found.append(f"{imp} ({source}/ may not import {target}/)")
        elif source == "control" and target == "tui" and not imp.lazy:
            found.append(f"{imp} (the console is imported lazily, inside the command)")
    return found


def framework_violations(tree: Tree) -> list[str]:
    return [
        f"{imp} ({_top(imp.source)}/ runs on a bare GPU box)"
        for imp in tree.imports
        if _top(imp.source) in BARE_FLOORS and _top(imp.target) in SERVER_FRAMEWORKS
    ]


def package_init_violations(tree: Tree) -> list[str]:
    """What is taken from a package must be a submodule (or a dunder such as ``__path__``),
    never a name its ``__init__`` defines; a package's own ``__init__`` may gather names."""
    found = []
    for imp in tree.imports:
        if imp.target not in tree.packages or imp.target == imp.source:
            continue
        names = [n for n in imp.names if not (n.startswith("__") and n.endswith("__"))]
        if any(f"{imp.target}.{name}" not in tree.files for name in names):
            found.append(f"{imp} (import from the submodule, not the package's __init__)")
    return found


def private_textual_violations(root: Path) -> list[str]:
    """``x._bindings`` or ``getattr(x, "_bindings")`` anywhere in our source or tests."""
    found = []
    paths = [p for top in (*MAY_IMPORT, "tests") for p in (root / top).rglob("*.py")]
    for path in sorted([*root.glob("*.py"), *paths]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                args = node.args[1:2]
                if node.func.id.endswith("attr") and args and isinstance(args[0], ast.Constant):
                    name = args[0].value
            if name in PRIVATE_TEXTUAL:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def block_manager_private_violations(root: Path) -> list[str]:
    """``x._name`` outside ``KV_FRIENDS``, for every private attribute the BlockManager
    sets up in its ``__init__`` (``x`` anything but ``self``)."""
    home = ast.parse((root / KV_CACHE).read_text())
    init = next(
        f
        for c in ast.walk(home)
        if isinstance(c, ast.ClassDef) and c.name == "BlockManager"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    private = {
        n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
    }
    found = []
    paths = [p for top in (*MAY_IMPORT, "tests") for p in (root / top).rglob("*.py")]
    friends = {root / friend for friend in KV_FRIENDS}
    for path in sorted(p for p in paths if p not in friends):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.attr}")
    return found


def seam_violations(tree: Tree) -> list[str]:
    found = []
    for imp in tree.imports:
        if not _under(imp.source, frozenset(SEAM_HOLDERS)):
            continue
        reached = tree.reached(imp) | {imp.target}
        if reached & ENGINE_IMPLEMENTATIONS or set(imp.names) & ENGINE_CLASSES:
            found.append(f"{imp} (routes and jobs hold the engine as an EngineService)")
    return found


def module_state_violations(tree: Tree) -> list[str]:
    """A ``global`` statement anywhere, or a module-level statement that calls an engine's
    constructor (``LLMEngine(...)``, ``AsyncEngine.from_config(...)``...)."""
    found = []
    for module, path in sorted(tree.files.items()):
        parsed = ast.parse(path.read_text(), str(path))
        for node in ast.walk(parsed):
            if isinstance(node, ast.Global):
                found.append(f"{module}:{node.lineno}: global {', '.join(node.names)}")
        for statement in parsed.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(statement):
                name = _dotted(node.func) if isinstance(node, ast.Call) else None
                if name is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    name = node.func.id
                if name and set(name.split(".")) & ENGINE_CLASSES:
                    found.append(f"{module}:{node.lineno}: {name}(...) at import time")
    return found


def fleet_front_violations(tree: Tree) -> list[str]:
    """Every module the fleet's control plane loads at import time, followed to the end."""
    by_source: dict[str, list[Import]] = {}
    for imp in tree.imports:
        if not imp.lazy:
            by_source.setdefault(imp.source, []).append(imp)
    found = []
    starts = [m for m in tree.files if _under(m, frozenset({FLEET_FRONT}))]
    for start in sorted(starts):
        seen, frontier = {start}, [(start, start)]
        while frontier:
            module, path = frontier.pop()
            for imp in by_source.get(module, []):
                for target in tree.reached(imp):
                    if target in seen or target not in tree.files:
                        continue
                    seen.add(target)
                    chain = f"{path} -> {target}"
                    if _under(target, MODEL_CODE):
                        found.append(f"{start}: loads model code ({chain})")
                    else:
                        frontier.append((target, chain))
    return found


def circle_violations(tree: Tree) -> list[str]:
    """An import, wherever it sits, from a module of ``NEVER_IMPORTS`` to one it must not reach."""
    found = []
    for imp in tree.imports:
        for source, banned in NEVER_IMPORTS.items():
            if _under(imp.source, frozenset({source})):
                hit = {t for t in tree.reached(imp) | {imp.target} if _under(t, banned)}
                if hit:
                    found.append(f"{imp} (a circle issue 43 opened: {source} -> {min(hit)})")
    return found


def cycle_violations(tree: Tree) -> list[str]:
    """Modules of ``control/`` that import each other, at module level or for the type checker
    (an import inside a function is the one allowed way back up)."""
    graph: dict[str, set[str]] = {m: set() for m in tree.files if _top(m) == "control"}
    for imp in tree.imports:
        if imp.source in graph and not imp.in_function:
            graph[imp.source] |= {t for t in tree.reached(imp) if t in graph} - {imp.source}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycle = " <-> ".join(sorted(component))
                found.extend(f"{m}: in an import cycle ({cycle})" for m in sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


RULES = {
    "floors": lambda root: floor_violations(Tree(root)),
    "no_cycles": lambda root: cycle_violations(Tree(root)),
    "circles_opened": lambda root: circle_violations(Tree(root)),
    "engine_seam": lambda root: seam_violations(Tree(root)),
    "module_state": lambda root: module_state_violations(Tree(root)),
    "fleet_front": lambda root: fleet_front_violations(Tree(root)),
    "frameworks": lambda root: framework_violations(Tree(root)),
    "package_init": lambda root: package_init_violations(Tree(root)),
    "private_textual": private_textual_violations,
    "block_manager_private": block_manager_private_violations,
}


@pytest.mark.parametrize("rule", RULES)
def test_the_tree_keeps_the_rule(rule: str) -> None:
    assert RULES[rule](ROOT) == []


def test_the_check_sees_the_whole_tree() -> None:
    tree = Tree(ROOT)
    assert {
        "serving.engine",
        "engine.kv_cache",
        "policies.registry",
        "kernels.reference",
        "tui.app",
    } <= set(tree.files)
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages <= set(MAY_IMPORT), f"not on a floor: {packages - set(MAY_IMPORT)}"


VIOLATIONS = {
    "floors": {
        "engine/sequence.py": "from policies.base import PolicySpec\n",
        "engine/batch.py": "def lazy():\n    from serving.llm import LLM\n",  # even lazily
        "tui/app.py": "def lazy():\n    from control.cli import main\n",
        "kernels/ops.py": "import engine.sequence\n",
        "policies/static.py": "from serving.engine import LLMEngine\n",
        "serving/engine.py": "from sim.simulator import Simulator\n",
        "sim/simulator.py": "from bench.runner import run\n",
        "control/cli.py": "from tui.app import App\n",
        "control/migrate.py": "import migrations\n\nmigrations.__path__\n",
    },
    "frameworks": {"policies/static.py": "from fastapi import FastAPI\n"},
    "package_init": {
        "bench/run.py": "from serving import LLM\n",
        "control/x.py": "import serving\n\nserving.LLM()\n",
    },
    "private_textual": {"tui/app.py": "app._bindings = None\ngetattr(app, '_bindings')\n"},
    "block_manager_private": {"bench/run.py": "engine.blocks._tables.pop('a')\n"},
    "engine_seam": {
        "control/api/routes/chat.py": "from serving.engine import LLMEngine\n",
        "control/jobs/maintenance.py": "from control.service.local import LocalEngine\n",
    },
    "module_state": {
        "control/server.py": "from serving.llm import LLM\n\nENGINE = LLM.from_config(None)\n",
        "engine/batch.py": "STATE = 0\n\n\ndef bump():\n    global STATE\n",
    },
    "fleet_front": {"control/fleet/fleet.py": "from control.front_helpers import load\n"},
    "circles_opened": {
        "engine/front.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from engine.builder import RandomWeights\n",
        "engine/parallel/worker.py": "def run():\n    from engine.builder import load_bundle\n",
        "engine/model/config.py": "def from_dir(path):\n"
        "    from engine.model.gguf_file import open_checkpoint\n",
    },
    "no_cycles": {
        "control/fleet/replica.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from control.fleet.fleet import Fleet\n",
        "control/fleet/fleet.py": "from control.fleet.replica import Replica\n",
    },
}


@pytest.mark.parametrize("rule", RULES)
def test_a_deliberate_violation_fails_the_rule(rule: str, tmp_path: Path) -> None:
    clean = {
        "serving/__init__.py": "from serving.llm import LLM\n",
        "serving/llm.py": "from engine.sequence import Sequence\nfrom policies.base import S\n",
        "serving/engine.py": "from serving.commands import CommandQueue\n",
        "serving/commands.py": "",
        "engine/__init__.py": "",
        "engine/sequence.py": "import torch\n",
        "engine/kv_cache.py": "class BlockManager:\n    def __init__(s):\n        s._tables = {}\n",
        "engine/batch.py": "from engine.sequence import Sequence\n",
        "engine/model/__init__.py": "",
        "engine/model/llama.py": "from kernels import ops\nfrom .. import sequence\n",
        "policies/__init__.py": "",
        "policies/base.py": "from engine.batch import Batch\nfrom pydantic import BaseModel\n",
        "policies/static.py": "from .base import S\n",
        "kernels/__init__.py": "",
        "kernels/ops.py": "import torch\n",
        "tui/__init__.py": "",
        "tui/app.py": "from textual.app import App\nfrom .screens import base\n",
        "tui/screens/__init__.py": "",
        "tui/screens/base.py": "",
        "bench/__init__.py": "",
        "control/__init__.py": "",
        "control/cli.py": "def tui():\n    from tui.app import App\n",
        "control/migrate.py": "import importlib.util\n\nimportlib.util.find_spec('migrations')\n",
        "migrations/__init__.py": "",
        "migrations/env.py": "from control.core.db import make_engine\n",
        "control/api/__init__.py": "",
        "control/api/routes/__init__.py": "",
        "control/api/routes/chat.py": "from control.service.protocol import EngineService\n",
        "control/service/protocol.py": "from engine.batch import Batch\n",
        "control/jobs/maintenance.py": "from control.service.protocol import EngineService\n",
        "control/server.py": "from serving.llm import LLM\n\n\ndef main():\n    LLM()\n",
        "control/fleet/__init__.py": "",
        "control/fleet/fleet.py": "from control.service.protocol import EngineService\n",
        "control/fleet/replica.py": "def build():\n    from serving.engine import LLMEngine\n",
        "control/front_helpers.py": "from engine.model.llama import Llama\n",
        "engine/front.py": "from engine.checkpoint_parts import RandomWeights\n",
        "engine/builder.py": "from engine.checkpoint_parts import RandomWeights\n",
        "engine/checkpoint_parts.py": "",
        "engine/parallel/__init__.py": "",
        "engine/parallel/worker.py": "",
        "sim/__init__.py": "",
        "sim/simulator.py": "from serving.engine import LLMEngine\n",
    }
    for name, text in clean.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert RULES[rule](tmp_path) == []
    for name, text in VIOLATIONS[rule].items():
        (tmp_path / name).write_text(text)
    found = RULES[rule](tmp_path)
    for name in VIOLATIONS[rule]:
        module = name.removesuffix(".py").replace("/", ".")
        assert any(f.startswith((f"{module}:", f"{name}:")) for f in found), (name, found)
