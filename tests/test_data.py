"""Prompts from data: each file kind and a ``datasets.Dataset`` give the prompt items the equivalent list gives,
their metadata columns reach the reward, and each bad file gets an error naming the file and the line."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.data import PromptFileError, load_prompts

ROWS = [
    {"prompt": "2+2=", "answer": "4"},
    {"prompt": 'He said "hi", then', "answer": "left"},
    {"prompt": "Zürich is", "answer": "a city"},
]


def write(path, text: str | bytes):
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def as_jsonl(tmp_path, rows=ROWS):
    return write(tmp_path / "p.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")


def as_csv(tmp_path):
    import csv

    path = tmp_path / "p.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["prompt", "answer"])
        writer.writeheader()
        writer.writerows(ROWS)
    return path


def test_every_file_kind_gives_the_rows(tmp_path):
    assert load_prompts(as_jsonl(tmp_path)) == ROWS
    assert load_prompts(write(tmp_path / "p.json", json.dumps(ROWS))) == ROWS
    columns = {"prompt": [r["prompt"] for r in ROWS], "answer": [r["answer"] for r in ROWS]}
    assert load_prompts(write(tmp_path / "c.json", json.dumps(columns))) == ROWS
    assert load_prompts(as_csv(tmp_path)) == ROWS
    txt = write(tmp_path / "p.txt", "The movie was\n\n  The film \r\nA story\n")
    assert load_prompts(txt) == ["The movie was", "  The film ", "A story"]
    assert load_prompts(str(txt)) == load_prompts(txt)  # str or Path
    assert load_prompts(write(tmp_path / "s.json", json.dumps(["a", "b"]))) == ["a", "b"]
    assert load_prompts(ROWS) is ROWS  # a list is taken as it is


def test_a_file_in_an_env_passes_its_columns_to_the_reward(tmp_path):
    calls = []

    def reward(prompts, completions, answer):  # TRL's reward-function shape, with the metadata column
        calls.append((list(prompts), list(answer)))
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    for source in (as_jsonl(tmp_path), as_csv(tmp_path)):
        env = gym.make("TextGen-v0", prompts=str(source), reward=reward, max_prompt_tokens=16)
        assert env.unwrapped.text_spec.prompt_texts == [r["prompt"] for r in ROWS]
        listed = gym.make("TextGen-v0", prompts=ROWS, reward=reward, max_prompt_tokens=16)
        o1, _ = env.reset(seed=0, options={"prompt_index": 0})
        o2, _ = listed.reset(seed=0, options={"prompt_index": 0})
        np.testing.assert_array_equal(o1["input_ids"], o2["input_ids"])
        tok = env.unwrapped.tokenizer
        for t in tok("4", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            _, r, term, _, _ = env.step(t)
        assert term and r == 1.0 and calls[-1] == (["2+2="], ["4"])
    vec = gym.make_vec("TextGen-v0", num_envs=2, device="cpu", prompts=as_jsonl(tmp_path), reward=reward)
    assert vec.text_spec.metadata == {"answer": [r["answer"] for r in ROWS]}


def test_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "ds"))
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    assert load_prompts(ds) == load_prompts(loaded) == ROWS
    env = gym.make("TextGen-v0", prompts=loaded, reward=lambda p, c, answer: [1.0] * len(c))
    assert env.unwrapped.text_spec.metadata == {"answer": [r["answer"] for r in ROWS]}
    with pytest.raises(TypeError, match=r"DatasetDict with splits \['train'\]; pass one split"):
        load_prompts(datasets.DatasetDict({"train": ds}))
    with pytest.raises(ValueError, match=r"columns \['text'\], no 'prompt' column"):
        load_prompts(datasets.Dataset.from_list([{"text": "a"}]))
    with pytest.raises(ValueError, match="dataset row #1: 'prompt' must be a str"):
        load_prompts(datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": None}]))


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("e.jsonl", "", r"e\.jsonl' holds no prompts"),
        ("b.txt", "\n  \n", r"b\.txt' holds no prompts"),
        ("m.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n{"text": "c"}\n', r"m\.jsonl:3 has no 'prompt' key"),
        ("j.jsonl", '{"prompt": "a"}\n{"prompt": "b",\n', r"j\.jsonl:2: not valid JSON"),
        ("u.jsonl", b'{"prompt": "a"}\n{"prompt": "\xff"}\n', r"u\.jsonl:2: not UTF-8 text"),
        ("u.txt", b"fine\nfine\n\xc3\x28\n", r"u\.txt:3: not UTF-8 text"),
        ("k.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n', r"k\.jsonl:2 has the columns \['prompt'\]"),
        ("n.jsonl", '{"prompt": 3}\n', r"n\.jsonl:1: 'prompt' must be a str"),
        ("l.jsonl", '["a"]\n', r"l\.jsonl:1 is a list; expected an object"),
        ("x.json", '[{"prompt": "a"},\n {"answer": 1}]', r"x\.json: item #1 has no 'prompt' key"),
        ("y.json", '[{"prompt": "a"},\n {"prompt": }]', r"y\.json:2: not valid JSON"),
        ("z.json", '"just a string"', r"holds a JSON str; expected a list"),
        ("c.json", '{"prompt": ["a", "b"], "answer": ["1"]}', r"columns needs lists of equal length"),
        ("h.csv", "text,answer\na,1\n", r"h\.csv:1: the header \['text', 'answer'\] has no 'prompt' column"),
        ("f.csv", "prompt,answer\na,1\nb,2,3\n", r"f\.csv:3: 3 fields, but the header has 2"),
        ("e.csv", "", r"e\.csv' holds no prompts"),
        ("prompts.yaml", "- a\n", r"prompts\.yaml' has an unknown kind; give a \.jsonl, \.json, \.csv, \.txt file"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, name, content, match):
    path = write(tmp_path / name, content)
    with pytest.raises(PromptFileError, match=match):
        load_prompts(path)
    with pytest.raises(ValueError, match=match):  # through an env too, before anything else is built
        gym.make("TextGen-v0", prompts=str(path))


def test_missing_file_and_a_str_that_is_not_a_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"prompt file '.*nope\.jsonl' does not exist"):
        gym.make("TextGen-v0", prompts=str(tmp_path / "nope.jsonl"))
    with pytest.raises(TypeError, match=r"prompts must be a list .*for one prompt, pass a list: prompts=\['The movie"):
        gym.make("TextGen-v0", prompts="The movie was")
