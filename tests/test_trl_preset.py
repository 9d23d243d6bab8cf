"""The ``"trl-grpo"`` preset computes TRL's default GRPO loss: one rollout of ours, fed to TRL's ``GRPOTrainer`` as its
generations (its ``rollout_func``), gives the same rewards, advantages, loss and gradient to float tolerance.

TRL scores the completions with its own reward call, computes its own advantages (``scale_rewards="group"``) and its
own loss (``loss_type="dapo"``, ``beta=0``) from the same initial weights; ours trains one update of the preset. The
test skips, saying so, where TRL is absent (the ``test`` extra installs it)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

import textrl_envs  # noqa: F401  (registers the ids)
from sb3_grpo.presets import PRESETS, make_preset
from textrl_envs.sb3 import make_vec_env

N_ENVS, GROUP, TOKENS = 4, 2, 4
PROMPTS = ["The movie was", "The film is"]  # the same number of tokens: no padding on either side


def char_length(completions, **kwargs):
    """A TRL-style reward that differs between completions: their length in characters."""
    return [float(len(c)) for c in completions]


class Episodes(BaseCallback):
    """The finished episodes of the rollout: (group, prompt index, completion ids, reward). The reward is scored
    here from the completion: the infos' own arrive later, from the background reward worker."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, int, tuple[int, ...], float]] = []

    def _on_step(self) -> bool:
        for done, info in zip(self.locals["dones"], self.locals["infos"]):
            if done:
                reward = char_length([info["completion"]])[0]
                self.rows.append((info["group_id"], info["prompt_index"], info["completion_ids"], reward))
        return True


def test_the_preset_is_trls_defaults():
    trl = pytest.importorskip("trl", reason="trl is not installed: the test extra (pip install -e '.[test]') has it")
    config = trl.GRPOConfig(output_dir="unused", report_to=[], use_cpu=True)
    kwargs = PRESETS["trl-grpo"].kwargs
    assert (config.loss_type, config.scale_rewards, config.beta) == ("dapo", "group", 0.0)
    assert kwargs["advantage"] == "group" and kwargs["kl_coef"] == config.beta
    assert kwargs["clip_range"] == config.epsilon and config.epsilon_high is None
    assert kwargs["n_epochs"] == config.num_iterations and kwargs["learning_rate"] == config.learning_rate
    assert kwargs["max_grad_norm"] == config.max_grad_norm
    assert (kwargs["grad_var_coef"], kwargs["adaptive_clip"], kwargs["explore_alpha"]) == (0.0, None, 0.0)


def test_one_batch_gives_trls_loss_and_gradient(tmp_path):
    pytest.importorskip("trl", reason="trl is not installed: the test extra (pip install -e '.[test]') has it")
    pytest.importorskip("datasets", reason="datasets is not installed: the test extra (pip install -e '.[test]') has")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # ours: one rollout of fixed-length episodes (LongReview-v0 ignores EOS), one update over the whole rollout
    venv = make_vec_env("LongReview-v0", n_envs=N_ENVS, group_size=GROUP, seed=3, prompts=PROMPTS,
                        reward=char_length, max_new_tokens=TOKENS)  # fmt: skip
    model = make_preset(
        "trl-grpo",
        "CausalLMPolicy",
        venv,
        n_steps=TOKENS,
        batch_size=N_ENVS * TOKENS,
        seed=3,
        device="cpu",
        max_grad_norm=1e9,
    )  # fmt: skip  (no clipping: the raw gradients compared)
    initial = copy.deepcopy(model.policy.lm)
    episodes = Episodes()
    model.learn(N_ENVS * TOKENS, callback=episodes)
    ours_loss = model.logger.name_to_value["train/policy_gradient_loss"]
    ours_grads = {n: p.grad.clone() for n, p in model.policy.lm.named_parameters()}
    rows = sorted(episodes.rows)  # by group: TRL reads each run of num_generations rows as one group
    assert len(rows) == N_ENVS and all(len(ids) == TOKENS for _, _, ids, _ in rows)
    assert len({r for *_, r in rows}) > 1  # the rewards differ: the advantages are not all 0

    # TRL: the same episodes as its generations, from the same initial weights
    spec = venv.get_attr("text_spec")[0]
    prompt_ids = [[int(t) for t in spec.prompt_ids[i]] for _, i, _, _ in rows]

    def rollout_func(prompts, trainer):
        return {"prompt_ids": prompt_ids, "completion_ids": [list(ids) for *_, ids, _ in rows], "logprobs": None}

    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=N_ENVS, num_generations=GROUP,
                        max_completion_length=TOKENS, bf16=False, use_cpu=True, report_to=[],
                        gradient_checkpointing=False, disable_dropout=True)  # fmt: skip
    trainer = GRPOTrainer(model=initial, reward_funcs=[char_length], args=config, processing_class=spec.tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
                          rollout_func=rollout_func)  # fmt: skip
    trainer.model.train()
    batch = trainer._generate_and_score_completions([{"prompt": spec.prompt_texts[i]} for _, i, _, _ in rows])
    rewards = np.array([r for *_, r in rows])
    group_adv = []
    for g in range(0, N_ENVS, GROUP):  # TRL's formula, by hand, on our rewards
        r = rewards[g : g + GROUP]
        group_adv += list((r - r.mean()) / (r.std(ddof=1) + 1e-4))
    np.testing.assert_allclose(batch["advantages"].numpy(), group_adv, rtol=1e-5, atol=1e-6)
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps  # as its training loop sets it
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    # TRL's ratio is exactly 1 (its old log-probs are the same forward's, detached); ours divides by the rollout's
    # log-probs, equal to float32 rounding (~1e-7 a token), so a loss whose exact value is 0 comes out within 1e-6
    assert loss.item() == pytest.approx(ours_loss, rel=1e-5, abs=1e-6)
    for name, param in trainer.model.named_parameters():
        th.testing.assert_close(ours_grads[name], param.grad, rtol=1e-4, atol=1e-7, msg=name)
