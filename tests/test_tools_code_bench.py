"""``textrl-bench tools-code``: a short run of the tool and code tasks, written as a stamped results page."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.tools_code import main, page_body


def test_the_page_is_stamped_and_reports_the_run(tmp_path):
    page = tmp_path / "tools-code.md"
    assert main(["--updates", "1", "--episodes", "4", "--tasks", "ToolUse-v0", "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Tool use and code: a short run\n\n- Command: `textrl-bench tools-code --updates 1")
    row = next(line for line in text.splitlines() if line.startswith("| `ToolUse-v0` | 1 | 640 |"))
    assert row.count("±") == 2 and "episodes ended" in text


def test_the_body_counts_calls_errors_and_programs():
    results = [
        {"env": "ToolUse-v0", "updates": 2, "tokens": 1280, "seconds": 3.0, "before": (0.0, 0.0),
         "after": (0.25, 0.1), "calls": [1, 2, 0], "errors": [0, 1, 0]},
        {"env": "CodeGen-v0", "updates": 2, "tokens": 1024, "seconds": 9.0, "before": (0.1, 0.05),
         "after": (0.2, 0.05), "calls": [], "errors": [], "statuses": {"done": 5, "timeout": 1},
         "program_seconds": [0.1] * 5 + [5.0]},
    ]  # fmt: skip
    body = page_body(results, episodes=16)
    assert "| `ToolUse-v0` | 2 | 1,280 | 3.0 | 0.000 ± 0.000 | 0.250 ± 0.100 |" in body
    assert "3 episodes ended, 1.00 tool calls per episode, 1 of 3 calls answered with an error" in body
    assert "6 programs run in the sandbox (5 done, 1 timeout), 0.92 s of wall time each" in body
