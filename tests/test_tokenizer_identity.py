"""The env's tokenizer is compared with the one saved with the policy's model by its vocabulary and special ids, not
only its size: a mismatch warns, or is refused under ``tokenizer_check="strict"``."""

from __future__ import annotations

import warnings

import pytest
from helpers import EOS, PROMPTS, WORDS, length_reward, word_tokenizer
from transformers import GPT2Config, GPT2LMHeadModel

from sb3_grpo import GRPO
from textrl_envs.sb3 import make_vec_env


def _tokenizer(words, eos="<eos>", unk="<unk>"):
    """The helpers' word-level tokenizer over ``words`` (``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2), with ``eos`` and
    ``unk`` naming which of those tokens play EOS and UNK."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<pad>", unk_token=unk)


def _model_folder(path, tokenizer):
    """A tiny GPT-2 saved with ``tokenizer`` (what a model folder from the Hub holds)."""
    cfg = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=EOS)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _env():
    tok = word_tokenizer()
    return make_vec_env(None, n_envs=2, device="cpu", prompts=PROMPTS, reward=length_reward, tokenizer=tok,
                        max_new_tokens=3, max_prompt_tokens=6)  # fmt: skip


def _grpo(folder, **policy_kwargs):
    return GRPO("CausalLMPolicy", _env(), n_steps=4, batch_size=8, device="cpu",
                policy_kwargs={"model": folder, **policy_kwargs})  # fmt: skip


def test_the_same_tokenizer_passes_silently(tmp_path):
    folder = _model_folder(tmp_path / "same", word_tokenizer())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _grpo(folder)


def test_a_vocabulary_of_the_same_size_in_another_order_warns_or_is_refused(tmp_path):
    swapped = list(WORDS)
    swapped[3], swapped[4] = swapped[4], swapped[3]  # "good" and "bad" change places: same size, same specials
    folder = _model_folder(tmp_path / "swapped", _tokenizer(swapped))
    with pytest.warns(UserWarning, match=r"another tokenizer.*other vocabularies \(id 6: 'bad' in the model's, 'good'"):
        _grpo(folder)
    with pytest.raises(ValueError, match=r"another tokenizer than the env's.*tokenizer_check': 'warn'"):
        _grpo(folder, tokenizer_check="strict")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _grpo(folder, tokenizer_check="off")
    with pytest.raises(ValueError, match="tokenizer_check must be one of"):
        _grpo(folder, tokenizer_check="loud")


def test_other_special_ids_are_named(tmp_path):
    folder = _model_folder(tmp_path / "eos", _tokenizer(WORDS, eos="<unk>", unk="<eos>"))  # same tokens, other roles
    with pytest.warns(UserWarning, match=r"eos_token_id 2 in the model's tokenizer, 1 in the env's"):
        _grpo(folder)


def test_a_model_without_a_saved_tokenizer_is_compared_by_size_only(tmp_path):
    cfg = GPT2Config(vocab_size=len(word_tokenizer()), n_positions=32, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "bare")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _grpo(str(tmp_path / "bare"))
