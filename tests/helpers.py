"""Small helpers the test modules share (importable because pytest puts ``tests/`` on ``sys.path``)."""

import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure

from sb3_grpo.common.buffers import GRPODictRolloutBuffer


def quiet(model):
    """``model`` with a logger that writes nowhere (and keeps ``name_to_value`` readable)."""
    model.set_logger(configure(None, []))
    return model


def params(model) -> dict[str, th.Tensor]:
    """A detached copy of the policy's state dict."""
    return {k: v.detach().clone() for k, v in model.policy.state_dict().items()}


class RolloutLog(BaseCallback):
    """Copies the logger's values at each rollout end (before SB3 dumps them)."""

    def __init__(self):
        super().__init__()
        self.values = []

    def _on_rollout_end(self):
        self.values.append(dict(self.model.logger.name_to_value))

    def _on_step(self):
        return True


# A tiny word-level text task for env tests: vocabulary, prompts and a cheap deterministic reward.
WORDS = [
    "the",
    "movie",
    "was",
    "good",
    "bad",
    "great",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "and",
    "it",
    "very",
    "fun",
    "plot",
]
PROMPTS = ["the movie was", "a cat sat on the mat", "the dog", "it was very", "the plot was"]
EOS = 1


def word_tokenizer():
    """A word-level Hugging Face tokenizer over :data:`WORDS` (``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": EOS, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def length_reward(prompts, completions, **_metadata):
    """Cheap deterministic reward: words in the completion, plus a per-prompt bonus."""
    return [len(c.split()) + 0.5 * len(p) for p, c in zip(prompts, completions)]


def register_test_id(env_id: str) -> None:
    """Register ``env_id`` as a task-less text env (prompts, reward and tokenizer come from ``gym.make`` kwargs)."""
    import gymnasium as gym

    if env_id not in gym.registry:
        gym.register(
            env_id,
            entry_point="textrl_envs.env:TextGenEnv",
            vector_entry_point="textrl_envs.vector:TextGenVectorEnv",
            kwargs={"task": None},
        )


def bundled_assets() -> bool:
    """Whether the bundled tokenizer is present (it ships with the package; a source tree may not have built it)."""
    try:
        from textrl_envs.assets import tokenizer_path

        return bool(tokenizer_path())
    except (ImportError, OSError, ValueError):
        return False


# The bad-input matrices (test_validation_*.py): each case is (id, action, expected exception, message regex).
GIVEN = "given"  # the folder a case may prepare; anything else left in the working directory is a partial file


def run_report(content: str):
    """Write ``content`` as ``given/results.json`` and run ``sb3-grpo report`` on that folder."""
    from pathlib import Path

    from sb3_grpo.cli import main as cli_main

    Path(GIVEN).mkdir()
    Path(GIVEN, "results.json").write_text(content)
    return cli_main(["report", GIVEN])


def case_ids(cases) -> list[str]:
    """Test ids of a bad-input matrix (plain tuples or ``pytest.param``)."""
    return [c.values[0] if hasattr(c, "values") else c[0] for c in cases]


def _listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def assert_refused(workdir, capsys, case, action, error, match) -> str:
    """Run ``action`` in the empty ``workdir``; it must raise ``error`` with a message matching ``match`` (a CLI:
    ``SystemExit(2)`` and the message on stderr) and leave nothing behind but what it put under ``given/``.

    :return: The message.
    """
    import os
    import re

    import pytest

    with pytest.raises(error) as info:
        action()
    if error is SystemExit:
        assert info.value.code == 2, f"{case}: exit status {info.value.code}, expected 2 (usage error)"
        message = capsys.readouterr().err
    else:
        message = str(info.value)
    assert re.search(match, message), f"{case}: message {message!r} does not match {match!r}"
    leftover = [p for p in _listing(workdir) if not (p == GIVEN or p.startswith(GIVEN + os.sep))]
    assert leftover == [], f"{case} left files behind: {leftover}"
    if (workdir / GIVEN).exists():
        assert not [p for p in _listing(workdir / GIVEN) if p.endswith(".tmp")]
    return message


def per_transition_copy(model, buf):
    """A per-transition buffer (SB3's DictRolloutBuffer plus the policy's log-probs) holding exactly the data of a
    SequenceRolloutBuffer."""
    copy = GRPODictRolloutBuffer(
        buf.buffer_size, model.observation_space, model.action_space, "cpu", buf.gae_lambda, buf.gamma, buf.n_envs
    )
    copy.observations = {"input_ids": buf.token_ids.numpy().copy(), "attention_mask": buf.token_mask.numpy().copy()}
    for name in ("actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages"):
        setattr(copy, name, getattr(buf, name).copy())
    copy.policy_log_probs = buf.policy_log_probs.copy()
    copy.full, copy.pos = True, buf.pos
    return copy


def collect_rollout(model, n_steps):
    """One rollout of ``n_steps`` steps per env into the model's buffer (no update); returns the buffer."""
    from stable_baselines3.common.callbacks import CallbackList

    model._setup_learn(n_steps * model.env.num_envs, None)
    callback = CallbackList([])
    callback.init_callback(model)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)
    return model.rollout_buffer


# -- a tiny GPT-2 policy setting (LoRA and mixture-of-experts tests) --------------------------------------------------

#: Actions and window width of :data:`TINY_OBS`.
TINY_V, TINY_W = 60, 14


def _tiny_obs():
    from gymnasium import spaces

    return spaces.Dict(
        {
            "input_ids": spaces.Box(0, TINY_V - 1, (TINY_W,), dtype="int64"),
            "attention_mask": spaces.Box(0, 1, (TINY_W,), dtype="int64"),
        }
    )


TINY_OBS = _tiny_obs()
TINY_LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}


def tiny_gpt2():
    """A 2-layer, 32-wide GPT-2 with a 64-token vocabulary, from torch seed 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    th.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_positions=64))


#: A ChatML template (the Qwen / SmolLM family's) for tests: a tokenizer with it is built from the bundled one.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if not (loop.last and continue_final_message) %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def bundled_tokenizer():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    return AutoTokenizer.from_pretrained(tokenizer_path())


def chat_tokenizer_folder(path) -> str:
    """The bundled tokenizer plus ChatML's two special tokens and template, saved in ``path``; returns the path."""
    tok = bundled_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(path)
    return str(path)
