"""The package layout: no import cycles (lazy function-level imports included), and a light ``import textrl_envs``.

:func:`import_graph` reads a package's source with :mod:`ast` (nothing is imported) and :func:`import_cycles`
finds the cycles in it, so a test can name the modules of a cycle instead of failing on a half-initialised
module at run time.
"""

from __future__ import annotations

import ast
import json
import re
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


# -- rooms: no two folders import each other ------------------------------------------------------------------------


def room_graph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The rooms directly under ``package`` and which import which: a room is a sub-package (with everything below
    it) or a module of ``package``'s own; ``a -> b`` when a module in room ``a`` imports one in room ``b``. The
    package's ``__init__`` (its front door, which may re-export its rooms) is no room.

    :param graph: :func:`import_graph`'s module graph.
    :param package: A package of it, e.g. ``"sb3_grpo.common"``.
    """
    prefix = package + "."

    def room(module: str) -> str | None:
        return prefix + module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    edges: dict[str, set[str]] = {}
    for module, imported in graph.items():
        here = room(module)
        if here is not None:
            edges.setdefault(here, set()).update(r for r in map(room, imported) if r is not None and r != here)
    return edges


def room_cycles(package: str, root: Path = REPO) -> list[str]:
    """The import cycles between the rooms of every package in ``package`` (itself and each sub-package, at every
    depth), as ``"in <package>: a -> b -> a"``."""
    graph = import_graph(package, root)
    packages = [name for name, path in module_names(package, root).items() if path.name == "__init__.py"]
    return [f"in {p}: {' -> '.join(cycle)}" for p in packages for cycle in import_cycles(room_graph(graph, p))]


def test_room_cycles_are_found_at_every_depth(tmp_path):
    pkg = tmp_path / "lib"
    for folder in ("policies", "common", "common/update", "common/rollout"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from lib.policies import models\n")  # the front door is no room
    (pkg / "policies" / "models.py").write_text("from lib.common import io\n")
    (pkg / "common" / "io.py").write_text("")
    (pkg / "common" / "skeleton.py").write_text("from lib.policies import models\nfrom lib.common.update import a\n")
    (pkg / "common" / "update" / "a.py").write_text("def f():\n    from lib.common.rollout import b\n")
    (pkg / "common" / "rollout" / "b.py").write_text("from lib.common.update import a\n")
    assert room_cycles("lib", tmp_path) == [
        "in lib: lib.common -> lib.policies -> lib.common",
        "in lib.common: lib.common.rollout -> lib.common.update -> lib.common.rollout",
    ]


def test_no_two_rooms_of_the_library_import_each_other():
    """At every level of ``sb3_grpo`` (its folders and top modules; ``common``'s rooms; ...) imports go one way:
    ``policies`` never imports ``common``, an algorithm's folder never imports another's, no room of ``common``
    imports one that imports it back."""
    assert len(module_names("sb3_grpo")) > 5
    cycles = room_cycles("sb3_grpo")
    assert not cycles, "rooms that import each other: " + "; ".join(cycles)


# -- names: one name, one thing ---------------------------------------------------------------------------------------

#: A file name two modules may share: each package's report writer (``sb3-grpo report``'s, ``human-eval report``'s).
SHARED_FILE_NAMES = {"__init__.py", "__main__.py", "report.py"}


def test_one_file_name_one_thing():
    """No two modules of ``sb3_grpo`` share a file name, nor one of ``sb3_grpo`` and one of ``textrl_envs`` (which it
    imports): ``sampling.py`` of checkpoint playback and of token sampling read as one thing in tracebacks and docs."""
    where: dict[str, list[str]] = {}
    for package in ("sb3_grpo", "textrl_envs"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name not in SHARED_FILE_NAMES:
                where.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    repeated = {n: p for n, p in where.items() if len(p) > 1 and any(x.startswith("sb3_grpo/") for x in p)}
    assert not repeated, f"one file name for several modules: {repeated}"


# -- algorithms: what they declare is what they accept -----------------------------------------------------------------


def _algorithms() -> list[type]:
    import sb3_grpo
    from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm

    found = [getattr(sb3_grpo, name) for name in sb3_grpo.__all__]
    return [cls for cls in found if isinstance(cls, type) and issubclass(cls, GroupOnPolicyAlgorithm)]


def test_every_algorithm_of_the_package_is_checked():
    assert {cls.__name__ for cls in _algorithms()} == {"GRPO", "DrGRPO", "DAPO", "GSPO", "CISPO", "ReinforcePP"}


@pytest.mark.parametrize("cls", _algorithms(), ids=lambda cls: cls.__name__)
def test_each_algorithm_declares_what_it_accepts(cls):
    """An algorithm's signature takes PPO's arguments and every shared option by name (so none is a ``TypeError``),
    its ``supports`` is its own declaration of registered values, and its defaults are among what it declares."""
    import inspect

    from stable_baselines3 import PPO

    from sb3_grpo.common.advantages.forms import ADVANTAGE_FORMS
    from sb3_grpo.common.data_parallel import DATA_PARALLEL
    from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm
    from sb3_grpo.common.options.support import SHARED_OPTIONS, Supports
    from sb3_grpo.common.rollout.redistribution import REDISTRIBUTIONS
    from sb3_grpo.engines import ENGINES

    accepted = inspect.signature(cls.__init__).parameters
    skeleton = inspect.signature(GroupOnPolicyAlgorithm.__init__).parameters
    assert set(inspect.signature(PPO.__init__).parameters) <= set(skeleton) <= set(accepted)
    assert not [p for p in accepted.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], "listed by name"
    supports = cls.__dict__.get("supports")
    assert isinstance(supports, Supports), f"{cls.__name__} declares no supports of its own"
    assert supports.advantages and set(supports.advantages) <= set(ADVANTAGE_FORMS)
    assert set(supports.engines) <= set(ENGINES) and set(supports.data_parallel) <= set(DATA_PARALLEL)
    assert set(supports.reward_redistribution) <= set(REDISTRIBUTIONS)
    for option in SHARED_OPTIONS:
        assert supports.supported(option, accepted[option].default), f"{cls.__name__}: the default {option}"
        assert cls.check_arguments({option: accepted[option].default}) is None


@pytest.mark.parametrize("cls", _algorithms(), ids=lambda cls: cls.__name__)
def test_parameter_docs_are_written_once(cls):
    """An algorithm's docstring documents the arguments its own constructor writes, not the skeleton's (PPO's and
    the shared options, documented once on ``GroupOnPolicyAlgorithm``), and stays short."""
    from sb3_grpo.common.on_policy import GroupOnPolicyAlgorithm

    code = cls.__dict__["__init__"].__code__  # the arguments written in the class (its signature lists all)
    own = {n for n in code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount] if n[0] != "_"}
    documented = set(re.findall(r":param (\w+):", cls.__doc__))
    assert documented == own, f"{cls.__name__}: documented {sorted(documented)}, own {sorted(own)}"
    skeleton = set(re.findall(r":param (\w+):", GroupOnPolicyAlgorithm.__doc__))
    assert {"advantage", "micro_batch_size", "data_parallel", "engine", "reward_redistribution"} <= skeleton
    assert len(cls.__doc__.splitlines()) <= 60, f"{cls.__name__}'s docstring has {len(cls.__doc__.splitlines())} lines"


# -- the layout pages -------------------------------------------------------------------------------------------------


def _tree_block(text: str) -> str:
    """The first fenced block that draws the layout (the one that names ``sb3_grpo/`` at a line's start)."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            blocks, current = (blocks + ["\n".join(current)], None) if current is not None else (blocks, [])
        elif current is not None:
            current.append(line)
    return next(b for b in blocks if re.search(r"^sb3_grpo/", b, flags=re.M))


def test_docs_layout_names_every_folder_and_nothing_else():
    """docs/layout.md's tree lists the folders of both packages (and ``common``'s rooms), and every name it lists
    under ``sb3_grpo/`` and ``textrl_envs/`` exists."""
    tree = _tree_block((REPO / "docs" / "layout.md").read_text(encoding="utf-8"))
    listed = set(re.findall(r"^\s+([a-z_]+/|[a-z_]+\.py)", tree, flags=re.M))
    for package in ("sb3_grpo", "textrl_envs"):
        folders = {f"{p.name}/" for p in (REPO / package).iterdir() if (p / "__init__.py").is_file()}
        assert folders <= listed, f"docs/layout.md lacks {sorted(folders - listed)} of {package}"
    rooms = {f"{p.name}/" for p in (REPO / "sb3_grpo" / "common").iterdir() if (p / "__init__.py").is_file()}
    assert rooms <= listed, f"docs/layout.md lacks common's rooms {sorted(rooms - listed)}"
    exists = {
        f"{p.name}/" if p.is_dir() else p.name
        for package in ("sb3_grpo", "textrl_envs", "sb3_grpo/common")
        for p in (REPO / package).iterdir()
    }
    assert listed - {"<algo>/"} <= exists, f"docs/layout.md names what does not exist: {sorted(listed - exists)}"


def test_readme_layout_names_every_algorithm_and_top_folder():
    import sb3_grpo

    tree = _tree_block((REPO / "README.md").read_text(encoding="utf-8"))
    for cls in _algorithms():
        assert cls.__name__ in tree or cls.__name__.lower() in tree, f"README's layout omits {cls.__name__}"
    for line in tree.splitlines():
        folder = line.split()[0] if line.strip() else ""
        assert not folder.endswith("/") or (REPO / folder).is_dir(), f"README's layout names {folder}, which is gone"
    assert "CausalLMPolicy" in tree and len(sb3_grpo.__all__) > 1
