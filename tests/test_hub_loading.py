"""Models and tokenizers by Hugging Face Hub id, from a local Hugging Face cache built in a temporary folder (offline,
nothing touches the network), and the way back: a policy exported as a Hugging Face model directory."""

from __future__ import annotations

import shutil
import socket
import warnings

import gymnasium as gym
import huggingface_hub.constants
import numpy as np
import pytest
import torch as th

import textrl_envs  # noqa: F401  (registers the envs)
from sb3_grpo import GRPO
from sb3_grpo.policies import CausalLMPolicy, export_pretrained
from sb3_grpo.policies.windows import positions_from_mask
from textrl_envs.assets import lm_path, tokenizer_path
from textrl_envs.core import load_tokenizer

LM_ID = "textrl-test/tiny-lm"
TOKENIZER_ID = "textrl-test/tiny-tokenizer"
MAIN = "a" * 40  # the commit hash refs/main points at
OTHER = "b" * 40  # a second snapshot, reachable by its hash only


def _snapshot(cache, repo_id: str, source, commit: str, ref: str | None = "main", absent: tuple = ()) -> None:
    """The layout huggingface_hub keeps: ``models--org--name/snapshots/<commit>/<files>``, ``refs/<ref>`` and
    ``.no_exist/<commit>/<file>`` for the files the Hub said the repository does not have."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo / "snapshots" / commit)
    if ref is not None:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    for name in absent:
        (repo / ".no_exist" / commit).mkdir(parents=True, exist_ok=True)
        (repo / ".no_exist" / commit / name).touch()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache in ``tmp_path`` holding the bundled LM and tokenizer under Hub ids; any socket
    connection fails the test."""
    cache = tmp_path / "hf" / "hub"
    _snapshot(cache, LM_ID, lm_path(), MAIN)
    _snapshot(cache, LM_ID, lm_path(), OTHER, ref=None, absent=("adapter_config.json",))
    _snapshot(cache, TOKENIZER_ID, tokenizer_path(), MAIN, absent=("config.json",))  # a tokenizer-only repository
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these at import: set them where it looks them up
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise AssertionError(f"a test of offline Hub loading opened a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache


def _env(tokenizer=TOKENIZER_ID):
    return gym.make("TextGen-v0", tokenizer=tokenizer, max_new_tokens=6)


def _grpo(env, **policy_kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8, n_epochs=1, seed=0, policy_kwargs=policy_kwargs)


def test_model_and_tokenizer_load_by_hub_id_from_the_cache(hub_cache):
    tok = load_tokenizer(TOKENIZER_ID)
    bundled = load_tokenizer(None)
    assert tok("the movie was")["input_ids"] == bundled("the movie was")["input_ids"]
    model = _grpo(_env(), model=LM_ID)
    reference = _grpo(_env(None), model=None)
    ours, theirs = model.policy.lm.state_dict(), reference.policy.lm.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        th.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0)
    spec = model.policy.lm_spec
    assert spec["name_or_path"] == LM_ID and spec["revision"] == MAIN


def test_revision_picks_the_snapshot_and_is_recorded(hub_cache, tmp_path):
    model = _grpo(_env(), model=LM_ID, revision=OTHER)
    assert model.policy.lm_spec["revision"] == OTHER
    model.save(tmp_path / "m.zip")
    shutil.rmtree(hub_cache)  # the saved model is portable: config from its spec, weights from its state dict
    loaded = GRPO.load(tmp_path / "m.zip", env=_env(None))
    assert loaded.policy.lm_spec["name_or_path"] == LM_ID and loaded.policy.lm_spec["revision"] == OTHER
    for key, value in model.policy.state_dict().items():
        th.testing.assert_close(loaded.policy.state_dict()[key], value, rtol=0, atol=0)


def test_offline_and_not_cached_names_the_id_cache_and_command(hub_cache):
    with pytest.raises(OSError, match=r"'org/not-cached'.*HF_HUB_OFFLINE=1.*hf download org/not-cached") as err:
        _grpo(_env(), model="org/not-cached")
    assert str(hub_cache) in str(err.value)
    with pytest.raises(OSError, match=r"revision 'v9'.*--revision v9"):
        _grpo(_env(), model=LM_ID, revision="v9")
    with pytest.raises(OSError, match=r"tokenizer 'org/no-tokenizer'.*hf download org/no-tokenizer"):
        load_tokenizer("org/no-tokenizer")


def test_a_missing_path_that_is_no_hub_id_is_still_a_missing_directory(hub_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model directory .*nope' does not exist.*Hub id"):
        _grpo(_env(), model=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"tokenizer path 'no/such/tokenizer' is not a directory"):
        load_tokenizer("no/such/tokenizer")


# ------------------------------------------------------------------------------------------------------------------
# Export: a trained policy as a Hugging Face model directory
# ------------------------------------------------------------------------------------------------------------------


def _policy_logits(policy: CausalLMPolicy, ids: th.Tensor) -> th.Tensor:
    mask = th.ones_like(ids)
    with th.no_grad():
        return policy._logits(policy._trunk(ids, mask, positions_from_mask(mask)))


def _exported_logits(path, ids: th.Tensor) -> th.Tensor:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(path).eval()
    with th.no_grad():
        return lm(input_ids=ids).logits.float()


def _perturb(module: th.nn.Module, names: str) -> None:
    """Move the named parameters off their initial values (LoRA's B starts at zero: an adapter that does nothing)."""
    gen = th.Generator().manual_seed(1)
    with th.no_grad():
        for name, param in module.named_parameters():
            if names in name:
                param.add_(0.05 * th.randn(param.shape, generator=gen))


def test_export_loads_in_transformers_with_the_policys_logits(tmp_path):
    model = _grpo(_env(None))
    model.learn(16)  # the weights now differ from the bundled LM's
    path = model.policy.save_pretrained(tmp_path / "export")
    ids = th.as_tensor(np.arange(4, 20).reshape(2, 8))
    ours = _policy_logits(model.policy, ids)
    theirs = _exported_logits(path, ids)[..., : model.policy.n_actions]
    th.testing.assert_close(theirs, ours)
    bundled = _exported_logits(lm_path(), ids)[..., : model.policy.n_actions]
    assert not th.allclose(bundled, ours)  # the test sees training


LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}


@pytest.mark.parametrize("merge_lora", [True, False])
def test_lora_export_merged_or_as_adapter(tmp_path, merge_lora):
    pytest.importorskip("peft")
    model = _grpo(_env(None), lora=LORA)
    _perturb(model.policy.lm, "lora_B")
    ids = th.as_tensor(np.arange(4, 20).reshape(2, 8))
    ours = _policy_logits(model.policy, ids)
    path = export_pretrained(model.policy, tmp_path / "export", merge_lora=merge_lora)
    files = {p.name for p in (tmp_path / "export").iterdir()}
    assert ("adapter_config.json" in files) is (not merge_lora)
    theirs = _exported_logits(path, ids)[..., : model.policy.n_actions]
    th.testing.assert_close(theirs, ours)
    th.testing.assert_close(_policy_logits(model.policy, ids), ours, rtol=0, atol=0)  # the policy is left as it was
    assert not th.allclose(_exported_logits(lm_path(), ids)[..., : model.policy.n_actions], ours)


def test_warm_start_takes_a_hub_id(hub_cache, tmp_path):
    import json

    from sb3_grpo.cli import main
    from sb3_grpo.warmstart import RECORD_FILE

    out = tmp_path / "warm"
    argv = ["warm-start", "--env", "Arithmetic-v0", "--steps", "2", "--batch-size", "4", "--out", str(out)]
    assert main([*argv, "--model", LM_ID]) == 0
    record = json.loads((out / RECORD_FILE).read_text())
    assert record["model"] == LM_ID and (out / "config.json").is_file()
    with pytest.raises(SystemExit):  # a path that names no folder and is no Hub id is still refused before training
        main([*argv[:-1], str(tmp_path / "w2"), "--model", "./no/such/folder"])
    assert not (tmp_path / "w2").exists()
