"""CompletionLogger: the sampled episodes' text read back from the JSONL file, tensorboard's events and the trackers;
a composite reward's component means in the logs."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from stable_baselines3 import PPO

from sb3_grpo import GRPO
from sb3_grpo.callbacks import CompletionLogger, configure_logger
from sb3_grpo.callbacks.completions import completion_row, composite_rewards, markdown_table
from textrl_envs.rewards import CompositeReward
from textrl_envs.sb3 import make_vec_env

SMALL = {"n_steps": 8, "batch_size": 32, "n_epochs": 1, "seed": 0, "device": "cpu"}


def _count(_prompts, completions):
    return [float(len(c.split())) for c in completions]


def _chars(_prompts, completions):
    return [float(len(c)) for c in completions]


def _tensorboard_texts(folder) -> dict[int, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("completions/samples/text_summary")
    return {e.step: e.tensor_proto.string_val[0].decode() for e in events}


def test_samples_reach_jsonl_and_tensorboard_with_the_env_text(tmp_path):
    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=2)
    model = GRPO("CausalLMPolicy", env, advantage="group", **{**SMALL, "n_steps": 4, "batch_size": 16})
    model.set_logger(configure_logger(tmp_path, ["tensorboard"]))
    logger_cb = CompletionLogger(every_n_rollouts=2, n_samples=3)
    # a second logger keeps every finished episode (n_samples above any rollout's count)
    everything = CompletionLogger(
        every_n_rollouts=1, n_samples=10_000, path=tmp_path / "all.jsonl", log_components=False, key="all"
    )
    model.learn(4 * 4 * 3, callback=[logger_cb, everything])
    model.logger.close()
    rows = [json.loads(line) for line in open(tmp_path / "completions.jsonl")]
    assert {r["rollout"] for r in rows} == {0, 2} and len(rows) == 6  # rollouts 0 and 2 of 3, 3 episodes each
    every = [json.loads(line) for line in open(tmp_path / "all.jsonl")]
    seen = {(r["rollout"], r["episode_id"]): r for r in every}
    for row in rows:
        same = seen[(row["rollout"], row["episode_id"])]  # the sampled row is that episode's, field for field
        assert row == same
        assert isinstance(row["completion"], str) and isinstance(row["prompt"], str)
        assert 1 <= row["length"] <= 2 and row["group_id"] is not None and row["reward"] is not None
    texts = _tensorboard_texts(tmp_path)
    assert sorted(texts) == sorted({r["timestep"] for r in rows})
    first = texts[min(texts)]
    for row in rows:
        if row["rollout"] == 0:
            assert row["prompt"].replace("|", "\\|") in first
    assert first.splitlines()[0].startswith("| timestep | rollout | env | group_id")


def test_composite_components_are_logged_each_rollout(tmp_path):
    reward = CompositeReward([(_count, 1.0), (_chars, 0.1)])
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3, reward=reward)
    assert composite_rewards(env) == [reward]
    model = PPO("MultiInputPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(configure_logger(tmp_path, ["csv"]))
    cb = CompletionLogger(every_n_rollouts=1, n_samples=100, path=tmp_path / "c.jsonl")
    from benchmarks.claims.diagnostics import RewardTerms

    beside = RewardTerms()  # a second reader of the same reward: each reads every episode
    model.learn(16 * 3, callback=[cb, beside])
    model.logger.close()
    import csv

    logged = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert len(logged) == 3
    rows = [json.loads(line) for line in open(tmp_path / "c.jsonl")]
    for k, row in enumerate(logged):
        episodes = [r for r in rows if r["rollout"] == k]  # n_samples above the rollout's episodes: all of them
        assert episodes
        words = [len(r["completion"].split()) for r in episodes]
        chars = [len(r["completion"]) for r in episodes]
        assert float(row["reward/_count"]) == pytest.approx(np.mean(words))
        assert float(row["reward/_chars"]) == pytest.approx(np.mean(chars))
        assert beside.series["_count"][k] == pytest.approx(np.mean(words))
        assert beside.series["_chars"][k] == pytest.approx(np.mean(chars))
        for r, w, c in zip(episodes, words, chars):
            assert r["reward"] == pytest.approx(w + 0.1 * c, rel=1e-5)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])  # PPO: scored in step; GRPO: scored in the background worker
def test_each_episode_carries_its_reward_components(tmp_path, algo):
    from sb3_grpo.callbacks.completions import table_rows

    reward = CompositeReward([(_count, 1.0), (_chars, 0.1)])
    env = make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=3, reward=reward)
    if algo == "ppo":
        model = PPO("MultiInputPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    else:
        model = GRPO("CausalLMPolicy", env, advantage="group", **{**SMALL, "batch_size": 32})
    model.set_logger(configure_logger(tmp_path, ["tensorboard"]))
    cb = CompletionLogger(every_n_rollouts=1, n_samples=100, path=tmp_path / "c.jsonl")
    model.learn(32 * 2, callback=cb)
    model.logger.close()
    rows = [json.loads(line) for line in open(tmp_path / "c.jsonl")]
    assert len(rows) >= 8
    for row in rows:  # recomputed by hand from the completion read back
        words, chars = float(len(row["completion"].split())), float(len(row["completion"]))
        assert row["reward_components"] == {"_count": words, "_chars": chars}
        assert row["reward"] == pytest.approx(words + 0.1 * chars, rel=1e-5)
    texts = _tensorboard_texts(tmp_path)
    last = texts[max(texts)].splitlines()
    header = [c.strip() for c in last[0].strip("|").split("|")]
    assert header[header.index("reward") + 1 : header.index("reward") + 3] == ["reward._count", "reward._chars"]
    shown = [r for r in rows if r["timestep"] == max(texts)]
    for line, row in zip(last[2:], shown, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[header.index("reward._count")]) == row["reward_components"]["_count"]
        assert float(cells[header.index("reward._chars")]) == pytest.approx(row["reward_components"]["_chars"])
    columns, flat = table_rows(shown)  # what the trackers' tables get
    assert "reward._chars" in columns and "reward_components" not in columns
    assert [f["reward._count"] for f in flat] == [r["reward_components"]["_count"] for r in shown]


def test_interactive_episodes_give_their_transcript(tmp_path):
    env = make_vec_env("GuessNumber-v0", n_envs=2, seed=0, device="cpu")
    model = GRPO("CausalLMPolicy", env, **SMALL)
    model.set_logger(configure_logger(tmp_path, []))
    cb = CompletionLogger(every_n_rollouts=1, n_samples=2)
    model.learn(64, callback=cb)
    rows = [row for sample in cb.samples for row in sample]
    assert rows, "no interactive episode finished"
    for row in rows:
        roles = [m["role"] for m in row["transcript"]]
        assert row["turns"] >= 1 and roles.count("agent") == row["turns"] and set(roles) <= {"agent", "env"}
        assert all(set(m) == {"role", "text"} for m in row["transcript"])
    saved = [json.loads(line) for line in open(tmp_path / "completions.jsonl")]
    assert saved == rows


def test_tables_reach_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    uri = "file:" + str(tmp_path / "mlruns")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    model = PPO("MultiInputPolicy", env, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(configure_logger(tmp_path, ["mlflow"], mlflow={"tracking_uri": uri}))
    run_id = model.logger.output_formats[0].run_id
    cb = CompletionLogger(every_n_rollouts=1, n_samples=2)
    model.learn(16, callback=cb)
    model.logger.close()
    (sample,) = cb.samples
    client = MlflowClient(tracking_uri=uri)
    (artifact,) = client.list_artifacts(run_id, "completions/table")
    saved = json.loads(open(client.download_artifacts(run_id, artifact.path, str(tmp_path / "dl"))).read())
    assert saved["data"] == [[r[c] for c in saved["columns"]] for r in sample]
    assert "transcript" not in saved["columns"] and "turns" not in saved["columns"]  # none in a one-turn env


def test_row_and_markdown_by_hand():
    info = {"prompt": "a|b", "completion": "x\ny", "completion_ids": (5, 6), "reward": np.float32(0.5), "group_id": 3}
    row = completion_row(info, env_index=1, timestep=40, rollout=2)
    assert row == {
        "timestep": 40, "rollout": 2, "env": 1, "group_id": 3, "episode_id": None, "prompt": "a|b",
        "completion": "x\ny", "reward": 0.5, "reward_components": None, "length": 2, "turns": None,
        "transcript": None,
    }  # fmt: skip
    assert markdown_table([row], ["prompt", "completion", "reward"]).splitlines() == [
        "| prompt | completion | reward |",
        "|---|---|---|",
        "| a\\|b | x<br>y | 0.5 |",
    ]
    with pytest.raises(ValueError, match="every_n_rollouts must be an int >= 1"):
        CompletionLogger(every_n_rollouts=0)
    with pytest.raises(ValueError, match="n_samples must be an int >= 1"):
        CompletionLogger(n_samples=-1)
