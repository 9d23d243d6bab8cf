"""The bundled tokenizer, LM and classifier load offline and behave; the corpus is deterministic."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import hashlib
import json
import math
import re

import pytest
import torch

from textrl_envs import assets
from textrl_envs.assets import corpus


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.tokenizer_path())


@pytest.fixture(scope="module")
def lm():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(assets.lm_path()).eval()


@pytest.fixture(scope="module")
def classifier():
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = assets.classifier_path()
    return AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path).eval()


def test_paths_are_absolute_dirs():
    for fn in (assets.tokenizer_path, assets.lm_path, assets.classifier_path):
        path = fn()
        assert isinstance(path, str) and os.path.isabs(path) and os.path.isdir(path)


def test_missing_asset_names_build_command(monkeypatch, tmp_path):
    monkeypatch.setattr(assets, "ASSETS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="textrl_envs.assets.build"):
        assets.lm_path()


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.bos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert 1000 <= len(tokenizer) <= 2000


def test_digits_are_single_tokens(tokenizer):
    for d in range(10):
        for text in (str(d), f" {d}"):
            assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == 1, text
    ids = tokenizer("12+7=19", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["1", "2", "+", "7", "=", "1", "9"]
    ids = tokenizer("Numbers: 3 15", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids][-3:] == [" 3", " 1", "5"]


def test_roundtrip(tokenizer):
    text = "The movie was wonderful. 12+7=19"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_lm_config_matches_tokenizer(lm, tokenizer):
    cfg = lm.config
    assert cfg.vocab_size >= len(tokenizer)
    assert lm.get_output_embeddings().weight.shape[0] >= len(tokenizer)
    assert cfg.eos_token_id == tokenizer.eos_token_id
    assert cfg.bos_token_id == tokenizer.bos_token_id
    assert cfg.pad_token_id == tokenizer.pad_token_id
    assert cfg.n_positions >= 128
    assert lm.generation_config.eos_token_id == tokenizer.eos_token_id
    assert lm.generation_config.pad_token_id == tokenizer.pad_token_id


def test_lm_tokenizer_bundled_with_lm(tokenizer):
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(assets.lm_path()).get_vocab() == tokenizer.get_vocab()


def test_lm_greedy_arithmetic_runs(lm, tokenizer):
    """The bundled LM answers an arithmetic prompt with a number (it learned the format, if not the sums), and its
    greedy continuations are the ones the build recorded in the manifest: these are the weights that were built."""
    from textrl_envs.assets.build import sample_continuations

    prompts = ["12+7=", "8*3=", "Numbers: 3"]
    samples = sample_continuations(lm, tokenizer, prompts)
    assert re.fullmatch(r"-?\d+", samples[0].strip()) and re.fullmatch(r"-?\d+", samples[1].strip()), samples
    assert samples == [assets.load_manifest()["samples"][p] for p in prompts]


def test_lm_continues_opener_with_words(lm, tokenizer):
    ids = tokenizer(corpus.REVIEW_OPENERS[0], return_tensors="pt")
    with torch.no_grad():
        out = lm.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert re.search(r"[a-z]{3,}", text), text


def test_classifier_prefers_positive(classifier, tokenizer):
    clf_tok, clf = classifier
    assert clf.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    assert clf.config.pad_token_id == clf_tok.pad_token_id
    assert clf_tok.get_vocab() == tokenizer.get_vocab()
    texts = [
        "The movie was wonderful and the acting felt honest. I would watch it again.",
        "The movie was terrible and boring. What a waste of time.",
    ]
    batch = clf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        probs = clf(**batch).logits.softmax(-1)[:, 1]
    assert probs[0] > probs[1]
    assert probs[0] > 0.5 > probs[1]


def test_manifest_sha256_matches_weights():
    manifest = assets.load_manifest()
    for name in ("lm/model.safetensors", "classifier/model.safetensors"):
        with open(os.path.join(assets.assets_dir(), name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == manifest["sha256"][name], name
    # the recorded command is the one build.py writes for the recorded arguments, so it rebuilds these assets
    from textrl_envs.assets.build import BUILD_COMMAND, parse_args, rebuild_command

    command = manifest["command"]
    assert command.startswith(BUILD_COMMAND + " ")
    args = parse_args(command[len(BUILD_COMMAND) :].split())
    assert rebuild_command(args) == command
    assert (args.seed, args.steps, args.threads) == (manifest["seed"], manifest["steps"], manifest["threads"])
    # the LM learned (loss far below a uniform guess over the vocabulary), the classifier beats chance
    vocab = manifest["tokenizer"]["len"]
    assert 0 < manifest["lm_final_loss"] < 0.5 * math.log(vocab)
    assert 0.9 < manifest["classifier_accuracy"] <= 1.0
    assert json.loads(json.dumps(manifest)) == manifest


def test_corpus_is_deterministic():
    assert corpus.generate_corpus(300, seed=3) == corpus.generate_corpus(300, seed=3)
    assert corpus.generate_corpus(300, seed=3) != corpus.generate_corpus(300, seed=4)


def test_corpus_formats():
    docs = corpus.generate_documents(3000, seed=0)
    kinds = {d.kind for d in docs}
    assert kinds == {name for name, _ in corpus.DOCUMENT_MIX}
    for d in docs:
        assert "\n" not in d.text
        if d.kind == "arithmetic":
            m = re.fullmatch(r"(\d+)([+*-])(\d+)=(-?\d+)", d.text)
            assert m, d.text
            a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
            assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
        elif d.kind == "numbers":
            assert re.fullmatch(r"Numbers:( \d{1,2}){3,10}", d.text), d.text
        elif d.kind == "concepts":
            assert re.fullmatch(r"Concepts: [a-z]+(, [a-z]+){1,2}\. Sentence: [A-Z].*\.", d.text), d.text
        elif d.kind == "keywords":
            assert re.fullmatch(r"Keywords: [a-z]+(, [a-z]+){0,2}\. Review: [A-Z].*\.", d.text), d.text
        else:
            assert d.text.startswith(corpus.REVIEW_OPENERS), d.text
    assert {d.label for d in docs if d.kind == "review"} == {0, 1, None}


def test_arithmetic_examples():
    items = corpus.arithmetic_examples(50, seed=1)
    assert items == corpus.arithmetic_examples(50, seed=1)
    for prompt, answer in items:
        assert prompt.endswith("=")
        assert str(eval(prompt[:-1])) == answer


def test_concept_examples():
    items = corpus.concept_examples(30, seed=2)
    assert items == corpus.concept_examples(30, seed=2)
    for prompt, refs in items:
        m = re.fullmatch(r"Concepts: ([a-z, ]+)\. Sentence:", prompt)
        assert m, prompt
        words = m[1].split(", ")
        assert 2 <= len(words) <= 3
        assert len(refs) == 3 and len(set(refs)) == 3
        for ref in refs:
            assert ref.startswith(" ") and ref.endswith(".")
            for w in words:  # the stem appears, possibly inflected (sing -> sang, write -> wrote)
                verb = corpus.VERBS_BY_BASE.get(w)
                forms = {w} if verb is None else {verb.base, verb.past, verb.third, verb.ing, verb.participle}
                assert any(re.search(rf"\b{f}\b", ref) for f in forms), (w, ref)


def test_keyword_examples():
    items = corpus.keyword_examples(30, seed=2)
    assert items == corpus.keyword_examples(30, seed=2)
    for prompt, keywords in items:
        assert prompt == f"Keywords: {', '.join(keywords)}. Review:"
        assert 1 <= len(keywords) <= 3


def test_review_openers():
    openers = corpus.review_openers()
    assert openers == list(corpus.REVIEW_OPENERS) and len(openers) >= 10
    assert all(isinstance(o, str) and o == o.strip() for o in openers)
