"""Shared test set-up: offline Hugging Face, one torch thread.

Nothing in the tests may reach a model hub (``HF_HUB_OFFLINE=1``), and the tiny models they train run
fastest, and steadiest, on one torch thread when two pytest workers share a 2-core machine.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    n = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(n)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory (the bad-input tests check that a refused command leaves nothing in it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    """One cache of converted GGUF models for the session (``TEXTRL_CACHE``; the pytest workers share it and the
    conversion holds a lock), so SmolLM2 is converted once per test run."""
    root = tmp_path_factory.getbasetemp().parent / "textrl-cache"
    old = os.environ.get("TEXTRL_CACHE")
    os.environ["TEXTRL_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("TEXTRL_CACHE", None)
    else:
        os.environ["TEXTRL_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """A tiny random Llama with ChatML's tokenizer, saved as a folder (a stand-in for a real instruct model)."""
    from helpers import chat_tokenizer_folder
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-chat")
    chat_tokenizer_folder(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)
