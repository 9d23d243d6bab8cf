"""LoRA checkpoints hold the adapters and the value head, not the base model: the base loads again by its path or Hub
id (from a local Hugging Face cache built in a temporary folder, offline), and the loaded model predicts exactly as
the saved one did. A base that is gone, or changed, is an error naming it."""

from __future__ import annotations

import io
import shutil
import socket
import warnings
import zipfile

import huggingface_hub.constants
import pytest
import torch as th

pytest.importorskip("peft", reason="LoRA needs the lora extra: pip install 'textrl[lora]'")

from sb3_grpo import GRPO
from textrl_envs.assets import lm_path
from textrl_envs.sb3 import make_vec_env

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "fan_in_fan_out": True}
LM_ID = "textrl-test/tiny-lm"
MAIN = "c" * 40


def _env():
    return make_vec_env("TextGen-v0", n_envs=4, group_size=2, seed=0, device="cpu", max_new_tokens=5)


def _trained(env, model, lora=LORA, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        algo = GRPO(
            "CausalLMPolicy",
            env,
            n_steps=6,
            batch_size=12,
            n_epochs=1,
            learning_rate=1e-2,
            seed=0,
            advantage="group",
            kl_coef=0.1,
            grad_var_coef=0.0,
            policy_kwargs={"model": model, "lora": lora, **kwargs},
        )
        algo.learn(2 * 6 * 4)
    return algo


def _saved_state(path) -> dict[str, th.Tensor]:
    with zipfile.ZipFile(path) as archive:
        return th.load(io.BytesIO(archive.read("policy.pth")), weights_only=True)


def _load(path, env, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPO.load(path, env=env, device="cpu", **kwargs)


def _windows():
    g = th.Generator().manual_seed(0)
    ids = th.randint(4, 1000, (3, 13), generator=g)
    mask = th.ones_like(ids)
    mask[0, :4] = 0
    act = th.zeros(3, 13, dtype=th.bool)
    act[:, -5:] = True
    return ids, mask, act


def _assert_same_model(a, b) -> None:
    pa, pb = dict(a.policy.named_parameters()), dict(b.policy.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert th.equal(pa[name], pb[name]), name
    ids, mask, act = _windows()
    with th.no_grad():
        for ours, theirs in zip(
            a.policy.evaluate_sequences(ids, mask, act), b.policy.evaluate_sequences(ids, mask, act)
        ):
            assert th.equal(ours, theirs)
        obs = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        assert (a.predict(obs, deterministic=True)[0] == b.predict(obs, deterministic=True)[0]).all()


@pytest.fixture
def base_dir(tmp_path):
    """A copy of the bundled LM in a folder of its own (the tests move and change it)."""
    return shutil.copytree(lm_path(), tmp_path / "base")


def test_checkpoint_holds_adapters_and_value_head_only(base_dir, tmp_path):
    env = _env()
    algo = _trained(env, str(base_dir))
    algo.save(tmp_path / "lora.zip")
    saved = _saved_state(tmp_path / "lora.zip")
    trainable = {n: q for n, q in algo.policy.named_parameters() if q.requires_grad}
    assert set(saved) == {*trainable, "base_fingerprint"}  # no base weight: only the adapters and the value head
    assert all("lora_" in n or n.startswith("value_head") for n in trainable)
    base_numel = sum(q.numel() for q in algo.policy.lm.parameters() if not q.requires_grad)
    saved_numel = sum(t.numel() for k, t in saved.items() if k != "base_fingerprint")
    assert saved_numel == sum(q.numel() for q in trainable.values()) < base_numel / 20
    # the file is a fraction of a full fine-tune's (whose policy.pth holds every base weight)
    full = _trained(env, str(base_dir), lora=None)
    full.save(tmp_path / "full.zip")
    full_state = _saved_state(tmp_path / "full.zip")
    assert set(full_state) == set(full.policy.state_dict()) and "base_fingerprint" not in full_state
    assert all(k in full_state for k in algo.policy.base_keys if "base_layer" not in k)
    assert (tmp_path / "lora.zip").stat().st_size < (tmp_path / "full.zip").stat().st_size / 4
    loaded = _load(tmp_path / "lora.zip", env)
    assert loaded.policy.lm_spec["weights"] == "name_or_path"
    _assert_same_model(algo, loaded)
    assert loaded.policy.lora == algo.policy.lora
    assert loaded.policy.optimizer.state_dict()["state"].keys() == algo.policy.optimizer.state_dict()["state"].keys()


def test_a_moved_base_is_named_and_found_again_with_base_model(base_dir, tmp_path):
    env = _env()
    algo = _trained(env, str(base_dir))
    algo.save(tmp_path / "lora.zip")
    moved = shutil.move(base_dir, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=r"adapters and the value head only.*base_model=") as err:
        _load(tmp_path / "lora.zip", env)
    assert str(base_dir) in str(err.value)
    loaded = _load(tmp_path / "lora.zip", env, base_model=str(moved))
    _assert_same_model(algo, loaded)
    assert loaded.policy_kwargs["model"] == str(moved)  # saved again, it names the base where it is now


def test_a_changed_base_is_refused(base_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    env = _env()
    algo = _trained(env, str(base_dir))
    algo.save(tmp_path / "lora.zip")
    other = AutoModelForCausalLM.from_pretrained(base_dir)
    with th.no_grad():
        other.transformer.h[2].mlp.c_fc.weight.add_(1e-3)
    other.save_pretrained(base_dir)
    with pytest.raises(ValueError, match=r"differ.*first differing tensor: lm\.transformer\.h\.2\.mlp\.c_fc\.weight"):
        _load(tmp_path / "lora.zip", env)


def test_a_base_without_a_name_stays_in_the_checkpoint(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(lm_path())
    config._name_or_path = ""
    th.manual_seed(0)
    env = _env()
    algo = _trained(env, AutoModelForCausalLM.from_config(config))  # built in memory: nothing to load it from
    algo.save(tmp_path / "lora.zip")
    saved = _saved_state(tmp_path / "lora.zip")
    assert set(saved) == set(algo.policy.state_dict()) and "base_fingerprint" not in saved
    assert any("base_layer" in k for k in saved)
    _assert_same_model(algo, _load(tmp_path / "lora.zip", env))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding the bundled LM under a Hub id; any socket connection fails the test."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / ("models--" + LM_ID.replace("/", "--"))
    shutil.copytree(lm_path(), repo / "snapshots" / MAIN)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(MAIN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise AssertionError(f"a test of offline Hub loading opened a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    return cache


def test_a_hub_base_loads_from_the_cache_at_its_revision(hub_cache, tmp_path):
    env = _env()
    algo = _trained(env, LM_ID)
    assert algo.policy_kwargs["model"]["revision"] == MAIN and algo.policy_kwargs["model"]["name_or_path"] == LM_ID
    algo.save(tmp_path / "lora.zip")
    assert not any("base_layer" in k for k in _saved_state(tmp_path / "lora.zip"))
    _assert_same_model(algo, _load(tmp_path / "lora.zip", env))
    shutil.rmtree(hub_cache)
    with pytest.raises(FileNotFoundError, match=rf"'{LM_ID}' at revision '{MAIN}'.*hf download {LM_ID} --revision"):
        _load(tmp_path / "lora.zip", env)
