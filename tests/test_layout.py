"""The package layout: no import cycles (lazy function-level imports included), and a light ``import textrl_envs``.

:func:`import_graph` reads a package's source with :mod:`ast` (nothing is imported) and :func:`import_cycles`
finds the cycles in it, so a test can name the modules of a cycle instead of failing on a half-initialised
module at run time.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def module_names(package: str, root: Path = REPO) -> dict[str, Path]:
    """Every module of ``package`` (found under ``root``) by dotted name; a package's ``__init__.py`` is the package."""
    base = root / package.replace(".", "/")
    if not (base / "__init__.py").is_file():
        raise ValueError(f"{package!r} is not a package under {root} (no {base / '__init__.py'})")
    names = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of ``modules`` (``a.b.attr`` -> ``a.b``)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def imported_modules(module: str, tree: ast.AST, modules: dict[str, Path], is_package: bool) -> set[str]:
    """The modules among ``modules`` that the source ``tree`` of ``module`` imports, at any depth of the tree.

    ``import a.b`` names ``a.b``; ``from a import b`` names the submodule ``a.b`` if there is one, else ``a``;
    relative imports are resolved against ``module`` (itself the package when ``is_package``). Parent packages
    that Python initialises on the way (``a`` for ``import a.b``) are not counted: a package's ``__init__``
    importing its own submodules would otherwise always be a cycle.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in map(lambda name: _known(name, modules), targets) if t is not None and t != module)
    return found


def import_graph(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (module-level and function-level imports alike).

    :param package: A package name, e.g. ``"textrl_envs"``.
    :param root: The directory that holds the package's folder.
    """
    modules = module_names(package, root)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = imported_modules(name, tree, modules, path.name == "__init__.py")
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a directed graph: one list per strongly connected component with more than one node
    (or a self-loop), sorted, each as a closed path ``[a, b, ..., a]`` through its component (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_closed_path(graph, c) for c in components)


def _closed_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A path ``[c0, ..., c0]`` inside one strongly connected component that starts and ends at its first node."""
    members, start = set(component), component[0]
    parents: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:  # breadth first from start, until an edge leads back to it
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:  # walk back from v to start, then close the loop
                    path = [v]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")  # cannot happen for a Tarjan component


def _describe(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join(c) for c in cycles)


# -- the functions themselves ------------------------------------------------------------------------------


def test_cycle_finder_on_small_graphs():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"a"}}) == [["a", "a"]]
    two = import_cycles({"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x", "a"}})
    assert two == [["a", "b", "a"], ["x", "y", "z", "x"]]


def test_import_graph_reads_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import sub\n")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\nfrom .leaf import thing\n")
    (pkg / "sub" / "leaf.py").write_text("import os\nthing = 1\n\ndef f():\n    from .. import top\n")
    (pkg / "top.py").write_text(
        "import pkg.sub.leaf as leaf\n\nclass C:\n    def m(self):\n        from pkg.sub import leaf\n"
    )
    (pkg / "other.py").write_text("from .sub.leaf import thing\nfrom pkg import top, missing_name\n")
    graph = import_graph("pkg", tmp_path)
    assert graph == {
        "pkg": {"pkg.sub"},
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.top"},  # function-level and relative (level 2)
        "pkg.top": {"pkg.sub.leaf"},  # module-level and inside a method
        "pkg.other": {"pkg.sub.leaf", "pkg.top", "pkg"},  # a name that is not a submodule comes from the package
    }
    assert import_cycles(graph) == [["pkg.sub.leaf", "pkg.top", "pkg.sub.leaf"]]


# -- the packages ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", ["textrl_envs", "sb3_grpo", "benchmarks"])
def test_no_import_cycles(package):
    graph = import_graph(package)
    assert len(graph) > 5  # the package was found and read
    cycles = import_cycles(graph)
    assert not cycles, f"import cycles in {package}: {_describe(cycles)}"


def imports_of_top_level(package: str, top: str, root: Path = REPO) -> list[str]:
    """``module:line`` of every import of ``top`` (or a submodule of it) in ``package``'s source, at any depth:
    ``import top...``, ``from top... import``, and ``importlib.import_module("top...")`` / ``__import__("top...")``
    with a literal name."""
    found = []

    def names(name: str) -> bool:
        return name == top or name.startswith(top + ".")

    for module, path in module_names(package, root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                hit = any(names(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                hit = node.level == 0 and names(node.module or "")
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                first = node.args[0] if node.args else None
                hit = (
                    called in ("import_module", "__import__")
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and names(first.value)
                )
            else:
                continue
            if hit:
                found.append(f"{module}:{node.lineno}")
    return found


def test_import_finder_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import benchmarks.perf\n")
    (pkg / "a.py").write_text("def f():\n    from benchmarks import cli\n")
    (pkg / "b.py").write_text("import importlib\nimportlib.import_module('benchmarks.claims')\n")
    (pkg / "c.py").write_text("from . import a\nimport benchmarks_other\nfrom lib import b\n")  # none of them
    assert imports_of_top_level("lib", "benchmarks", tmp_path) == ["lib:1", "lib.a:2", "lib.b:2"]


@pytest.mark.parametrize("package", ["textrl_envs", "sb3_grpo"])
def test_the_library_never_imports_the_benchmarks(package):
    """The lab (``benchmarks/``) imports the library, never the other way round."""
    assert len(module_names(package)) > 5  # the package was found and read
    found = imports_of_top_level(package, "benchmarks")
    assert not found, f"{package} imports benchmarks at {found}"


def test_the_lab_is_out_of_the_library():
    """The study and perf code lives in ``benchmarks/``: no ``sb3_grpo/bench`` and no second bench system."""
    assert not (REPO / "sb3_grpo" / "bench").exists()
    assert not (REPO / "scripts").exists()
    assert (REPO / "benchmarks" / "__init__.py").is_file() and (REPO / "benchmarks" / "timing.py").is_file()
    # every folder of it is a regular package, so that an install (setuptools' find_packages) ships it
    folders = {p.parent for p in (REPO / "benchmarks").rglob("*.py") if "__pycache__" not in p.parts}
    assert not [str(f) for f in folders if not (f / "__init__.py").is_file()]


def code_strings(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the string constants in its code (docstrings left out: they may quote ids as examples)."""
    out = {}
    for name, path in module_names(package, root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        out[name] = {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        }
    return out


def test_env_ids_are_written_only_in_the_list_of_tasks():
    import textrl_envs
    from textrl_envs.suites.textarena_aec import OFFLINE_TWO_PLAYER_GAMES

    strings = code_strings("textrl_envs")
    for env_id in textrl_envs.ENV_IDS:
        where = sorted(m for m, values in strings.items() if any(env_id in v for v in values))
        if env_id in OFFLINE_TWO_PLAYER_GAMES:  # TextArena's own game ids, some of which our games share
            where = [m for m in where if m != "textrl_envs.suites.textarena_aec"]
        assert where == ["textrl_envs.tasks"], f"{env_id!r} is written in {where}; only textrl_envs/tasks/__init__.py"


#: Modules that ``import textrl_envs`` must not import: heavy libraries, and our modules that pull in the rewards.
HEAVY = ("torch", "transformers", "tokenizers", "vaderSentiment", "rouge_score", "sacrebleu")
NOT_AT_IMPORT = ("textrl_envs.rewards", "textrl_envs.core", "textrl_envs.env", "textrl_envs.vector", "textrl_envs.sb3")


def test_import_textrl_envs_is_light():
    code = (
        "import json, sys\n"
        "before = set(sys.modules)\n"
        "import textrl_envs, gymnasium as gym\n"
        "ids = [i for i in gym.registry if i in textrl_envs.ENV_IDS]\n"
        "print(json.dumps({'new': sorted(set(sys.modules) - before), 'ids': ids}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    result = json.loads(out.stdout)
    heavy = [m for m in result["new"] if m.split(".")[0] in HEAVY]
    ours = [m for m in result["new"] if m.startswith(NOT_AT_IMPORT)]
    assert not heavy and not ours, f"import textrl_envs imported {heavy + ours}"
    import textrl_envs

    assert result["ids"] and sorted(result["ids"]) == sorted(textrl_envs.ENV_IDS)  # and it registered every id


@pytest.mark.parametrize("package", ["textrl_envs", "sb3_grpo"])
def test_no_frame_walking(package):
    """Nothing reaches into callers' frames (``sys._getframe``, ``inspect.currentframe``/``stack``)."""
    found = []
    for name, path in module_names(package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "currentframe", "stack"):
                if isinstance(node.value, ast.Name) and node.value.id in ("sys", "inspect"):
                    found.append(f"{name}:{node.lineno}")
    assert not found, f"frame walking in {found}"


def test_grpo_outside_torchrun_never_touches_torch_distributed(monkeypatch):
    """Without torchrun's variables GRPO takes the single-process seam and starts no process group."""
    import torch.distributed as dist

    from sb3_grpo import GRPO, distributed
    from sb3_grpo.common.data_parallel import SingleProcess

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("torch.distributed was asked to start a process group")

    monkeypatch.setattr(dist, "init_process_group", forbidden)
    monkeypatch.setattr(distributed, "setup", forbidden)
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0)
    assert type(model._data_parallel) is SingleProcess
    model.learn(64)
    assert model.num_timesteps == 64
