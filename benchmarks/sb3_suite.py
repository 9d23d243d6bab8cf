"""SB3's own test suite for PPO, run as is and with ``GRPO`` under PPO's name, as a user porting code would.

The tests come from the source distribution of the installed stable-baselines3 (``pip download``; PyPI must be
reachable) or from ``--tests DIR``. Two copies are run with pytest: the stock one with ``-k PPO``, and a ported one
in which every ``from stable_baselines3 import ..., PPO, ...`` becomes ``from sb3_grpo import GRPO as PPO`` (so the
parametrized ids read ``GRPO``), with ``-k "PPO or GRPO"``. The page lists the totals and every test that passes
stock and fails ported, with the reason where it is a known, intended difference. A few minutes on 2 cores::

    textrl-bench sb3-suite --page docs/results/sb3_suite.md
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

from sb3_grpo.compare.pages import write_results_page

#: Tests that pass for stock PPO and fail for GRPO under PPO's name by design: test id -> why.
INTENDED = {
    "test_run.py::test_ppo_warnings": (
        "SB3's warning about running an MLP policy on the GPU names the algorithm's class, which is `GRPO`; the test "
        "matches the text 'run PPO'"
    ),
    "test_tensorboard.py::test_tensorboard[ppo]": (
        "the default `tb_log_name` is the algorithm's class name, as each SB3 algorithm's is its own (`GRPO_1`, "
        "where the test looks for `PPO_1`); pass `tb_log_name='PPO'` to keep the old folder names"
    ),
    "test_save_load.py::test_save_load_backward_compatible[PPO]": (
        "the test saves `lambda` schedules (code, pickled by value) and loads them back; `GRPO.load` refuses a "
        "checkpoint entry that names code unless the file is trusted (`load(..., trusted=True)`) or the entry is "
        "replaced (`custom_objects`), so that a crafted checkpoint cannot run code on load; SB3's schedule classes "
        "(`LinearSchedule`, `ConstantSchedule`) load as before"
    ),
    "test_identity.py::test_discrete[env2-PPO]": (
        "MultiBinary identity, one seed at a short budget: GRPO's defaults (penalty, asymmetric clip, exploration) "
        "take another random path; the identity results page (`textrl-bench identity`) runs this setting over ten "
        "seeds for both and checks that GRPO with its extras off equals PPO to the bit"
    ),
}

IMPORT = re.compile(r"^from stable_baselines3 import ([^\n(]+)\n", re.MULTILINE)


def port_source(source: str) -> str:
    """``source`` with PPO imported as GRPO under PPO's name (the other names of the import kept)."""

    def swap(match: re.Match) -> str:
        names = [n.strip() for n in match.group(1).split(",")]
        if "PPO" not in names:
            return match.group(0)
        rest = [n for n in names if n != "PPO"]
        kept = f"from stable_baselines3 import {', '.join(rest)}\n" if rest else ""
        return kept + "from sb3_grpo import GRPO as PPO\n"

    return IMPORT.sub(swap, source)


def fetch_tests(into: Path) -> Path:
    """SB3's tests folder from the source distribution of the installed version (``pip download``)."""
    wanted = version("stable-baselines3")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", f"stable-baselines3=={wanted}", "--no-binary", ":all:"]
        + ["--no-deps", "-d", str(into)],
        check=True,
    )
    archive = next(into.glob("stable_baselines3-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return next(into.glob("stable_baselines3-*/tests"))


def outcomes(junit: Path) -> dict[str, str]:
    """``file::test[params]`` -> ``passed``/``failed``/``skipped`` from a pytest JUnit report."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_file = case.get("classname", "").split(".")[-1] + ".py"
        state = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        elif case.find("skipped") is not None:
            state = "skipped"
        found[f"{test_file}::{case.get('name')}"] = state
    return found


def run_pytest(folder: Path, keyword: str, junit: Path, workers: int) -> None:
    """pytest on ``folder`` with ``-k keyword``, writing ``junit``; a failing test is data, not an error here."""
    skip = [f"--ignore={p}" for p in folder.glob("test_*.py") if not _collects(p)]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", "-k", keyword]
    cmd += ["-n", str(workers)] if workers > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*cmd, *skip, f"--junitxml={junit}", str(folder)], env=env, check=False, stdout=subprocess.DEVNULL)


def _collects(path: Path) -> bool:
    """Whether a test module imports here (SB3's ``test_utils.py`` needs ``ale_py``, an Atari extra)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        check=False,
    )
    return probe.returncode in (0, 5)


def suite_page(stock: dict[str, str], ported: dict[str, str]) -> tuple[str, list[str]]:
    """The page's Markdown, and the tests that pass stock and fail ported for a reason not in :data:`INTENDED`."""
    as_ppo = {name.replace("GRPO", "PPO"): state for name, state in ported.items()}
    both = sorted(set(stock) & set(as_ppo))
    regressions = [n for n in both if stock[n] == "passed" and as_ppo[n] == "failed"]
    unexplained = [n for n in regressions if n not in INTENDED]

    def count(d: dict[str, str], state: str) -> int:
        return sum(d[n] == state for n in both)

    lines = [
        f'SB3 {version("stable-baselines3")}\'s tests selected by `-k PPO` (stock) and `-k "PPO or GRPO"` (ported), '
        f"matched by name: {len(both)} tests.",
        "",
        "| run | passed | failed | skipped |",
        "|---|---|---|---|",
        f"| stock `PPO` | {count(stock, 'passed')} | {count(stock, 'failed')} | {count(stock, 'skipped')} |",
        f"| `GRPO` as `PPO` | {count(as_ppo, 'passed')} | {count(as_ppo, 'failed')} | {count(as_ppo, 'skipped')} |",
        "",
        "Tests that pass for stock PPO and fail for GRPO under PPO's name:",
        "",
        "| test | why |",
        "|---|---|",
    ]
    lines += [f"| `{n}` | {INTENDED.get(n, '**not explained: a defect**')} |" for n in regressions]
    if not regressions:
        lines.append("| (none) | |")
    return "\n".join(lines), unexplained


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=None, help="SB3's tests folder (default: from its sdist)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    parser.add_argument("--page", type=Path, default=None, help="write the result as a results page (Markdown)")
    args = parser.parse_args(argv)
    if args.tests is not None and not (args.tests / "test_identity.py").is_file():
        parser.error(f"argument --tests: {args.tests} is not SB3's tests folder (it has no test_identity.py)")
    with tempfile.TemporaryDirectory(prefix="sb3-suite-") as tmp:
        work = Path(tmp)
        source = args.tests if args.tests is not None else fetch_tests(work / "sdist")
        shutil.copytree(source, work / "stock")
        shutil.copytree(source, work / "ported")
        for module in (work / "ported").glob("test_*.py"):
            module.write_text(port_source(module.read_text()))
        run_pytest(work / "stock", "PPO", work / "stock.xml", args.workers)
        run_pytest(work / "ported", "PPO or GRPO", work / "ported.xml", args.workers)
        body, unexplained = suite_page(outcomes(work / "stock.xml"), outcomes(work / "ported.xml"))
    print(body)
    if args.page is not None:
        command = shlex.join(["textrl-bench", "sb3-suite", *argv])
        write_results_page(args.page, "SB3's PPO tests with GRPO", body, command)
        print(f"wrote {args.page}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
