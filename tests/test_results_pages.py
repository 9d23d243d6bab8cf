"""Results pages (:mod:`sb3_grpo.compare.pages`): the stamp's fields, the git commit and its ``+dirty`` mark, and
an atomic write (a failed write leaves the previous page as it was)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from sb3_grpo.compare import pages
from sb3_grpo.compare.pages import git_commit, write_results_page

INFO = {
    "hardware": {"cpu": "Test CPU 9000", "usable_cpus": 2, "cpu_count": 4, "gpu": None},
    "versions": {"torch": "9.9.9"},
}


def test_the_page_starts_with_the_stamp(tmp_path):
    path = write_results_page(
        tmp_path / "results" / "perf.md",
        "Throughput",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "textrl-bench perf",
        info=INFO,
    )
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "# Throughput"
    assert "- Command: `textrl-bench perf`" in lines
    commit = next(line for line in lines if line.startswith("- Commit: "))
    assert re.fullmatch(r"- Commit: `([0-9a-f]{4,40}(\+dirty)?|unknown)`", commit), commit
    assert "- Hardware: Test CPU 9000, 2 of 4 cores; no GPU; torch 9.9.9" in lines
    assert re.search(r"^- Date: \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC$", text, re.M)
    assert text.index("- Date:") < text.index("| a | b |") and text.endswith("| 1 | 2 |\n")


def test_the_hardware_line_names_the_gpu(tmp_path):
    info = {**INFO, "hardware": {**INFO["hardware"], "gpu": "NVIDIA H200"}}
    text = write_results_page(tmp_path / "p.md", "T", "body", "cmd", info=info).read_text()
    assert "; NVIDIA H200; torch 9.9.9" in text


def test_a_failed_write_leaves_the_previous_page(tmp_path, monkeypatch):
    path = tmp_path / "perf.md"
    write_results_page(path, "Old", "old figures", "cmd", info=INFO)
    before = path.read_text()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(pages.os, "replace", failing_replace)  # the rename into place fails
    with pytest.raises(OSError, match="disk full"):
        write_results_page(path, "New", "new figures", "cmd", info=INFO)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["perf.md"]  # no temporary file left behind


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="title is empty"):
        write_results_page(tmp_path / "p.md", " ", "body", "cmd", info=INFO)
    with pytest.raises(ValueError, match="command is empty"):
        write_results_page(tmp_path / "p.md", "T", "body", "", info=INFO)
    assert not (tmp_path / "p.md").exists()


def test_git_commit_outside_a_checkout_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git executable")
def test_git_commit_is_the_short_hash_and_marks_changes(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    short = git("rev-parse", "--short", "HEAD").strip()
    assert git_commit(tmp_path) == short
    (tmp_path / "untracked.md").write_text("a results page, say\n")  # untracked files do not count
    assert git_commit(tmp_path) == short
    (tmp_path / "a.txt").write_text("two\n")
    assert git_commit(tmp_path) == short + "+dirty"
