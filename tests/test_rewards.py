"""Every built-in reward pinned on hand-made examples with hand-computed values; registry, call_reward,
composition and the evaluation metrics."""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch as th

from textrl_envs.rewards import (
    ArithmeticReward,
    Bleu,
    CompositeReward,
    ExactMatch,
    HFClassifierReward,
    IncreasingNumbersReward,
    KeywordCoverage,
    LengthPenalty,
    LexiconSentiment,
    RepetitionPenalty,
    RewardModel,
    RougeL,
    call_reward,
    distinct_n,
    make_reward,
    mean_length,
    perplexity,
    register_reward,
    registered_rewards,
    repetition_rate,
    resolve_reward,
)
from textrl_envs.rewards.constraints import inflections
from textrl_envs.rewards.match import infer_answer

BUILTINS = [
    "arithmetic",
    "bleu",
    "classifier",
    "composite",
    "exact-match",
    "increasing-numbers",
    "keywords",
    "length",
    "repetition",
    "rouge-l",
    "sentiment",
]


def approx(x, **kw):
    return pytest.approx(x, rel=1e-9, abs=1e-12, **kw)


# ----------------------------------------------------------------------------------------------
# sentiment
# ----------------------------------------------------------------------------------------------


def test_lexicon_sentiment_hand_values():
    # VADER: compound = s / sqrt(s^2 + 15), rounded to 4 places, with s the summed valence;
    # "good" = 1.9, "bad" = -2.5
    r = LexiconSentiment()
    got = r(["p", "p", "p"], ["good", "bad", ""])
    assert got == [round(1.9 / math.sqrt(1.9**2 + 15), 4), round(-2.5 / math.sqrt(2.5**2 + 15), 4), 0.0]
    assert got[:2] == [0.4404, -0.5423]
    prob = LexiconSentiment(scale="prob")(["p"], ["good"])
    assert prob == [approx((0.4404 + 1) / 2)]
    # the prompt is scored only on request
    assert LexiconSentiment()(["good"], [""]) == [0.0]
    assert LexiconSentiment(include_prompt=True)(["good"], [""]) == [approx(got[0])]
    with pytest.raises(ValueError, match="scale"):
        LexiconSentiment(scale="percent")


def test_sentiment_registered_default():
    r = make_reward("sentiment")
    assert isinstance(r, LexiconSentiment) and r.name == "sentiment"
    assert r(["The movie was"], [" great, I loved it."])[0] > 0.5


# ----------------------------------------------------------------------------------------------
# HF classifier (a tiny random classifier made here, and the bundled one)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_classifier_dir(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2ForSequenceClassification

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        num_labels=2,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
        pad_token_id=tok.pad_token_id,
    )
    model = GPT2ForSequenceClassification(cfg)
    path = tmp_path_factory.mktemp("clf")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _manual_logits(path, text):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"][:16]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].double().numpy()


def test_classifier_prob_and_logit_match_a_manual_forward(tiny_classifier_dir):
    texts = ["the movie was great", "bad", "it was a film about a dog and a cat"]
    r = HFClassifierReward(tiny_classifier_dir, device="cpu")
    z = np.stack([_manual_logits(tiny_classifier_dir, t) for t in texts])
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    np.testing.assert_allclose(r(["p"] * 3, texts), p[:, 1], rtol=1e-5)
    logit = HFClassifierReward(tiny_classifier_dir, output="logit", label="negative", device="cpu")
    np.testing.assert_allclose(logit(["p"] * 3, texts), z[:, 0], rtol=1e-5, atol=1e-6)


def test_classifier_batching_truncation_and_empty_text(tiny_classifier_dir):
    texts = ["a", "the movie was great and the music was lovely", "", "word " * 200]
    big = HFClassifierReward(tiny_classifier_dir, batch_size=32, device="cpu", empty_score=None)
    one = HFClassifierReward(tiny_classifier_dir, batch_size=1, device="auto", empty_score=None)
    a, b = big(["p"] * 4, texts), one(["p"] * 4, texts)
    np.testing.assert_allclose(a, b, rtol=1e-5)  # padding does not change a score
    assert np.all((a > 0) & (a < 1))  # the empty text ran through the model as one EOS token
    # by default an empty or blank completion earns empty_score, without running the model
    default = HFClassifierReward(tiny_classifier_dir, device="cpu")
    got = default(["p"] * 4, texts[:2] + ["", "  "])
    np.testing.assert_allclose(got, list(a[:2]) + [0.0, 0.0], rtol=1e-5)
    assert HFClassifierReward(tiny_classifier_dir, empty_score=-1.0)(["p"], [""]) == [-1.0]
    assert big.max_length == 16  # the model's position limit
    assert big.to("cpu") is big and str(big.device) == "cpu"
    assert "POSITIVE" in repr(big)


def test_classifier_errors(tiny_classifier_dir, tmp_path):
    with pytest.raises(ValueError, match=r"label 'HAPPY' is not one of .*NEGATIVE.*POSITIVE"):
        HFClassifierReward(tiny_classifier_dir, label="HAPPY")
    with pytest.raises(ValueError, match="output must be one of"):
        HFClassifierReward(tiny_classifier_dir, output="score")
    with pytest.raises(ValueError, match="not a directory"):
        HFClassifierReward(str(tmp_path / "nowhere"))


def test_bundled_classifier_prefers_positive_text():
    r = make_reward("classifier")
    pos, neg = r(
        ["p", "p"],
        [" The movie was wonderful and the acting was brilliant.", " The movie was terrible and the acting was awful."],
    )
    assert 0.5 < pos <= 1.0 and 0.0 <= neg < 0.5


# ----------------------------------------------------------------------------------------------
# exact match, arithmetic, increasing numbers
# ----------------------------------------------------------------------------------------------


def test_exact_match():
    r = ExactMatch()
    got = r(["q"] * 5, [" 19 ", "19.", "Paris", "paris", "x"], answer=["19", "19", "paris", ["Rome", "Paris"], "y"])
    assert got == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert ExactMatch(casefold=False)(["q"], ["Paris"], answer=["paris"]) == [0.0]
    assert ExactMatch(strip=False)(["q"], [" 19"], answer=["19"]) == [0.0]
    with pytest.raises(ValueError, match="needs per-example answer"):
        r(["q"], ["19"])
    with pytest.raises(ValueError, match="no 'answer' for example #0"):
        r(["q"], ["19"], answer=[None])


def test_arithmetic_partial_credit_hand_values():
    r = ArithmeticReward()  # partial_weight=0.5, format_weight=0.1
    got = r(["12+7="] * 8, ["19", " 19", "18", "19 apples", "abc", "", "+19", "40"], answer=["19"] * 8)
    assert got == [
        1.0,
        1.0,
        approx(0.1 + 0.5 * (1 - 1 / 20)),  # well formed, off by one: 0.575
        approx(0.5),  # right number, extra text: closeness 1, no format credit
        0.0,
        0.0,
        1.0,
        approx(0.1),  # |40-19|/20 > 1: closeness 0, format credit only
    ]
    assert r(["3-5="], ["-1"], answer=[-2]) == [approx(0.1 + 0.5 * (1 - 1 / 3))]
    # no answer metadata: computed from the prompt
    assert r(["3*4=", "15-9=", "2+2="], ["12", "6", "5"]) == [1.0, 1.0, approx(0.1 + 0.5 * (1 - 1 / 5))]
    assert infer_answer("7*8=") == 56 and infer_answer("hello") is None
    with pytest.raises(ValueError, match="no 'answer'"):
        r(["What is two plus two?"], ["4"])
    strict = ArithmeticReward(partial_weight=0.0, format_weight=0.0)
    assert strict(["1+1="] * 2, ["2", "3"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="partial_weight"):
        ArithmeticReward(partial_weight=0.95, format_weight=0.1)


def test_increasing_numbers_hand_values():
    r = IncreasingNumbersReward(target=5)
    got = r(["Numbers:"] * 6, ["1 2 3 4 5", "3 8 15", "1 2 a 3 1 9", "", "1 2 3 4 5 6 7", "9 3"])
    assert got == [1.0, approx(3 / 5), approx(3 / 6), 0.0, 1.0, approx(1 / 5)]
    # a trailing number in the prompt sets the start
    assert r(["Numbers: 3"] * 2, [" 2 4", " 4 6 8 10 12"]) == [0.0, 1.0]
    # digits written right after the prompt's last digit join it: "3" + "5 8" reads "35 8"
    assert r(["Numbers: 3"], ["5 8"]) == [approx(1 / 5)]
    assert IncreasingNumbersReward(target=5, continue_prompt=False)(["Numbers: 3"], [" 2 4"]) == [approx(2 / 5)]
    with pytest.raises(ValueError, match="target"):
        IncreasingNumbersReward(target=0)


# ----------------------------------------------------------------------------------------------
# reference-based
# ----------------------------------------------------------------------------------------------


def test_rouge_l_hand_values():
    r = RougeL()
    # LCS("a cat sat on mat", "the cat sat on the mat") = cat sat on mat: P = 4/5, R = 4/6
    f = 2 * (4 / 5) * (4 / 6) / (4 / 5 + 4 / 6)
    got = r(
        ["p", "p", "p"],
        ["a cat sat on mat", "A CAT SAT ON MAT", ""],
        references=[["the cat sat on the mat", "a dog"], "the cat sat on the mat", ["x"]],
    )
    assert got == [approx(f), approx(f), 0.0]
    assert r(["p"], ["the dog"], references=[["the cat", "the dog"]]) == [1.0]  # best reference
    assert RougeL()(["p"], ["cats"], references=[["cat"]]) == [1.0]  # Porter stemming, no download
    assert RougeL(use_stemmer=False)(["p"], ["cats"], references=[["cat"]]) == [0.0]
    with pytest.raises(ValueError, match="needs per-example references"):
        r(["p"], ["x"])
    with pytest.raises(ValueError, match="empty 'references'"):
        r(["p"], ["x"], references=[[]])


def test_bleu_hand_values():
    r = Bleu()
    got = r(
        ["p"] * 3,
        ["the cat sat on the mat", "", "the cat"],
        references=[[" the cat sat on the mat"], ["a b"], ["the cat sat on the mat"]],
    )
    # "the cat": 1- and 2-gram precisions 1 (effective order 2), brevity penalty exp(1 - 6/2)
    assert got == [1.0, 0.0, approx(math.exp(-2.0))]
    # all references count at once: the closest length sets the brevity penalty
    assert r(["p"], ["the cat sat"], references=[["the cat sat on the mat", "a cat sat"]]) == [approx(1.0)]


# ----------------------------------------------------------------------------------------------
# constraints
# ----------------------------------------------------------------------------------------------


def test_keyword_coverage_hand_values():
    r = KeywordCoverage()
    got = r(
        ["p"] * 6,
        ["The Music was loud.", "stories and loving", "a musical", "the ending; music!", "", "special effects rock"],
        keywords=[["music", "ending"], ["story", "love"], ["music"], "music, ending", [], ["special effect"]],
    )
    assert got == [0.5, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert set(inflections("story")) >= {"story", "stories", "storied"}
    assert set(inflections("love")) >= {"loves", "loved", "loving"}
    # the prompt lists the keywords: it counts only on request
    assert r(["Keywords: plot."], [" nice"], keywords=[["plot"]]) == [0.0]
    assert KeywordCoverage(include_prompt=True)(["Keywords: plot."], [" nice"], keywords=[["plot"]]) == [1.0]
    with pytest.raises(ValueError, match="needs per-example keywords"):
        r(["p"], ["x"])


def test_length_penalty_hand_values():
    r = LengthPenalty(min_words=5, max_words=20)
    got = r(["p"] * 4, ["a b c", " ".join(["w"] * 12), " ".join(["w"] * 23), ""])
    assert got == [approx(-0.2), 0.0, approx(-0.3), approx(-0.5)]
    assert LengthPenalty(max_words=2, per_word=1.0, cap=2.0)(["p"], ["a b c d e f"]) == [-2.0]
    assert LengthPenalty()(["p"], [""]) == [0.0]
    with pytest.raises(ValueError, match="min_words"):
        LengthPenalty(min_words=5, max_words=3)


def test_repetition_penalty_hand_values():
    r = RepetitionPenalty()
    got = r(["p"] * 4, ["the cat the cat", "the cat sat", "hi", "a a a a"])
    assert got == [approx(-1 / 3), 0.0, 0.0, approx(-2 / 3)]
    assert RepetitionPenalty(n=1)(["p"], ["a a b b"]) == [approx(-0.5)]
    with pytest.raises(ValueError, match="n must be"):
        RepetitionPenalty(n=0)


# ----------------------------------------------------------------------------------------------
# composition
# ----------------------------------------------------------------------------------------------


def test_composite_weights_and_components():
    c = CompositeReward({"sentiment": 1.0, "length": (0.5, {"min_words": 3})})
    good = 0.4404  # VADER compound of "good"; "good good good" is higher
    got = c(["p", "p"], ["good", "good good good"])
    assert got[0] == approx(good - 0.5 * 0.2)
    assert set(c.last_components) == {"sentiment", "length"}
    np.testing.assert_allclose(c.last_components["length"], [-0.2, 0.0])
    assert c.weights == {"sentiment": 1.0, "length": 0.5}
    assert c.name == "composite(1*sentiment + 0.5*length)"

    def brevity(_prompts, completions):  # a TRL-style plain callable; gets no metadata
        return [-len(x) for x in completions]

    c2 = CompositeReward([(ExactMatch(), 2.0), (brevity, 0.1), ("length", -1.0, {"max_words": 1}), ("length", 1.0)])
    got = c2(["q", "q"], ["4", "5 6"], answer=["4", "4"])
    np.testing.assert_allclose(got, [2.0 - 0.1, -0.3 + 0.1])
    assert list(c2.last_components) == ["exact-match", "brevity", "length", "length#2"]


def test_composite_registered_and_errors():
    c = make_reward("composite", components={"keywords": 1.0, "repetition": 0.5})
    assert isinstance(c, CompositeReward)
    assert c(["p"], ["music music music"], keywords=[["music"]]) == [approx(1.0 - 0.5 * 0.5)]
    with pytest.raises(RuntimeError, match=r"'keywords'.*needs per-example keywords"):
        call_reward(c, ["p"], ["x"])
    with pytest.raises(ValueError, match="at least one component"):
        CompositeReward({})
    with pytest.raises(ValueError, match="weights must be finite"):
        CompositeReward({"length": float("nan")})
    with pytest.raises(ValueError, match="is not registered"):
        CompositeReward({"lenght": 1.0})
    with pytest.raises(TypeError, match="components must be"):
        CompositeReward("length")


def _as_number(_prompts, completions):  # the completion read as a number
    return [float(x) for x in completions]


def _tens(_prompts, completions):  # 10 per unit, on another scale
    return [10.0 * float(x) ** 2 for x in completions]


def test_composite_normalize_batch_by_hand():
    c = CompositeReward([(_as_number, 1.0), (_tens, 0.5)], normalize="batch")
    got = c(["p"] * 3, ["1", "2", "3"])
    # a = [1, 2, 3]: mean 2, population std sqrt(2/3); b = [10, 40, 90]: mean 140/3, std sqrt(9800/9)
    z_a = [(1 - 2) / math.sqrt(2 / 3), 0.0, (3 - 2) / math.sqrt(2 / 3)]
    mean_b, std_b = 140 / 3, math.sqrt(((10 - 140 / 3) ** 2 + (40 - 140 / 3) ** 2 + (90 - 140 / 3) ** 2) / 3)
    z_b = [(b - mean_b) / std_b for b in (10, 40, 90)]
    np.testing.assert_allclose(got, [za + 0.5 * zb for za, zb in zip(z_a, z_b)], rtol=1e-6)
    np.testing.assert_allclose(c.last_components["_tens"], [10, 40, 90])  # logged unnormalised
    assert c.name.endswith("[normalize=batch]")
    # one episode in a batch: no spread, every component scores 0
    assert c(["p"], ["7"]) == [approx(0.0)]


def test_composite_normalize_running_by_hand():
    c = CompositeReward([(_as_number, 2.0)], normalize="running")
    np.testing.assert_allclose(c(["p", "p"], ["1", "3"]), [2.0 * -1.0, 2.0 * 1.0], rtol=1e-6)  # mean 2, std 1
    # every score so far: 1, 3, 5 -> mean 3, population std sqrt(8/3)
    np.testing.assert_allclose(c(["p"], ["5"]), [2.0 * (5 - 3) / math.sqrt(8 / 3)], rtol=1e-6)


def test_composite_component_means_since_last_pop():
    c = CompositeReward([(_as_number, 1.0), (_tens, -1.0)], normalize="batch")
    c(["p"] * 2, ["1", "2"])
    c(["p"], ["6"])
    assert c.pop_component_means() == {"_as_number": approx(3.0), "_tens": approx((10 + 40 + 360) / 3)}
    assert c.pop_component_means() == {}
    c(["p"], ["2"])
    assert c.pop_component_means() == {"_as_number": approx(2.0), "_tens": approx(40.0)}
    with pytest.raises(ValueError, match="normalize must be one of"):
        CompositeReward([(_as_number, 1.0)], normalize="zscore")


def test_composite_readers_each_count_from_their_own_last_read():
    c = CompositeReward([(_as_number, 1.0), (_tens, -1.0)])
    c(["p"], ["9"])  # before either reader: neither sees it
    early, late = c.component_reader(), None
    c(["p"] * 2, ["1", "2"])
    late = c.component_reader()
    c(["p"], ["6"])
    assert c.pop_component_means() == {"_as_number": approx(18 / 4), "_tens": approx((810 + 10 + 40 + 360) / 4)}
    assert early.pop() == {"_as_number": approx(3.0), "_tens": approx((10 + 40 + 360) / 3)}
    assert late.pop() == {"_as_number": approx(6.0), "_tens": approx(360.0)}
    assert early.pop() == {} and late.pop() == {}  # the other's read took nothing from either
    c(["p"], ["2"])
    assert late.pop() == {"_as_number": approx(2.0), "_tens": approx(40.0)}
    assert early.pop() == {"_as_number": approx(2.0), "_tens": approx(40.0)}
    assert c.pop_component_means() == {"_as_number": approx(2.0), "_tens": approx(40.0)}
    made = make_reward("composite", components={"length": 1.0}, normalize="running")
    assert made.normalize == "running"


# ----------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------


def test_registry_lists_builtins_and_rejects_unknown_names():
    assert set(BUILTINS) <= set(registered_rewards())
    with pytest.raises(ValueError) as err:
        make_reward("sentimnt")
    msg = str(err.value)
    assert "'sentimnt' is not registered" in msg and "Did you mean 'sentiment'" in msg
    for name in BUILTINS:
        assert name in msg
    assert "callable" in msg
    with pytest.raises(TypeError, match="registered name"):
        make_reward(3)


def test_register_custom_reward_and_resolve():
    @register_reward("test-constant-reward")
    class Constant(RewardModel):
        def __init__(self, value=1.0):
            super().__init__("test-constant-reward")
            self.value = value

        def score(self, _prompts, completions, **_metadata):
            return [self.value] * len(completions)

    assert make_reward("test-constant-reward", value=2.5)(["p"], ["c"]) == [2.5]
    assert "test-constant-reward" in registered_rewards()
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test-constant-reward", lambda: None)

    def fn(_prompts, completions, **_metadata):
        return [0.0] * len(completions)

    assert resolve_reward(fn) is fn
    with pytest.raises(TypeError, match="reward_kwargs are only used"):
        resolve_reward(fn, scale="prob")
    with pytest.raises(TypeError, match="reward must be a registered name"):
        resolve_reward(42)


# ----------------------------------------------------------------------------------------------
# call_reward: TRL-style callables and every failure
# ----------------------------------------------------------------------------------------------


def test_trl_style_callables_plug_in():
    def length_reward(_prompts, completions, **_metadata):
        return [float(len(c)) for c in completions]

    def uses_answer(_prompts, completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    def two_args(_prompts, completions):
        return [1.0] * len(completions)

    meta = {"answer": ["4", "5"], "other": [1, 2]}
    np.testing.assert_array_equal(call_reward(length_reward, ["p", "q"], ["ab", "c"], meta), [2.0, 1.0])
    np.testing.assert_array_equal(call_reward(uses_answer, ["p", "q"], ["4", "4"], meta), [1.0, 0.0])
    np.testing.assert_array_equal(call_reward(two_args, ["p", "q"], ["4", "4"], meta), [1.0, 1.0])
    out = call_reward(length_reward, ["p"], ["x"])
    assert out.dtype == np.float64 and out.shape == (1,)


def test_call_reward_errors_name_the_reward_and_show_the_completion():
    def wrong_count(_prompts, _completions):
        return [1.0]

    def scalar(_prompts, _completions):
        return 1.0

    def nan_reward(_prompts, _completions):
        return [1.0, float("nan")]

    def raising(_prompts, _completions):
        raise KeyError("boom")

    def strings(_prompts, _completions):
        return ["high", "low"]

    args = (["p1", "p2"], ["first completion", "second completion"])
    with pytest.raises(ValueError, match=r"reward 'wrong_count' returned 1 value.*2 completions"):
        call_reward(wrong_count, *args)
    with pytest.raises(ValueError, match=r"reward 'scalar' returned a scalar"):
        call_reward(scalar, *args)
    with pytest.raises(
        ValueError, match=r"reward 'nan_reward' returned a non-finite value \(nan\).*'second completion'"
    ):
        call_reward(nan_reward, *args)
    assert np.isnan(call_reward(nan_reward, *args, on_nonfinite="nan")[1])
    with pytest.raises(RuntimeError, match=r"reward 'raising' raised KeyError: 'boom'.*'first completion'") as err:
        call_reward(raising, *args)
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(ValueError, match=r"reward 'strings' must return a sequence of floats"):
        call_reward(strings, *args)
    with pytest.raises(RuntimeError, match=r"reward 'exact-match' raised ValueError"):
        call_reward(ExactMatch(), *args)


def test_reward_values_fast_path_agrees_with_the_checked_path():
    """A list of Python floats skips the per-item checks; every other return still goes through them."""
    from textrl_envs.rewards.base import reward_values

    floats = [0.5, -1.25, 3.0, 1e-300]
    fast = reward_values(floats, "r")
    assert fast.dtype == np.float64 and fast.tolist() == floats
    checked = reward_values(tuple(floats), "r")  # a tuple takes the checked path
    np.testing.assert_array_equal(fast, checked)
    assert reward_values([], "r").shape == (0,)
    mixed = reward_values([0.5, np.float32(0.25), 2, np.array(1.5)], "r")  # not all floats: checked path
    assert mixed.tolist() == [0.5, 0.25, 2.0, 1.5]
    for bad in ([0.5, True], [0.5, None], [0.5, "0.5"]):  # one non-float item sends the list to the checks
        with pytest.raises(ValueError, match="rewards are numbers only"):
            reward_values(bad, "r")


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------


def test_distinct_and_repetition_metrics_hand_values():
    texts = ["the cat sat", "the cat ran", "a"]
    # bigrams: (the cat) (cat sat) (the cat) (cat ran): 3 unique of 4
    assert distinct_n(texts, 2) == approx(3 / 4)
    # unigrams: the cat sat the cat ran a: 5 unique of 7
    assert distinct_n(texts, 1) == approx(5 / 7)
    assert distinct_n([], 2) == 0.0 and distinct_n(["a"], 2) == 0.0
    # within-text: "a a a a" bigram rep 1 - 1/3; "the cat sat" 0; "a" left out
    assert repetition_rate(["a a a a", "the cat sat", "a"], 2) == approx((2 / 3 + 0.0) / 2)
    assert repetition_rate(["a"], 2) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        distinct_n(texts, 0)


def test_mean_length_words_and_tokens():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path

    assert mean_length(["a b c", "d", ""]) == approx(4 / 3)
    assert mean_length([]) == 0.0
    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    # the bundled tokenizer has one token per digit (a digit keeps its leading space)
    assert mean_length(["12 34", "5"], tokenizer=tok) == approx((4 + 1) / 2)


@pytest.fixture(scope="module")
def tiny_lm():
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from textrl_envs.assets import tokenizer_path

    tok = AutoTokenizer.from_pretrained(tokenizer_path())
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2))
    return model.eval(), tok


def _manual_nll(model, ids, first):
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    return [-float(logp[t - 1, ids[t]]) for t in range(first, len(ids))]


def test_perplexity_matches_a_manual_computation(tiny_lm):
    model, tok = tiny_lm

    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    prompts, texts = ["The movie was", "12+7="], [" great fun.", "19"]
    nll = []
    for p, t in zip(prompts, texts):
        nll += _manual_nll(model, enc(p) + enc(t), len(enc(p)))  # completion tokens only
    want = math.exp(sum(nll) / len(nll))
    assert perplexity(texts, model, tok, prompts=prompts, batch_size=1) == pytest.approx(want, rel=1e-5)
    assert perplexity(texts, model, tok, prompts=prompts, batch_size=8) == pytest.approx(want, rel=1e-5)
    # without prompts, each text is scored after the BOS token (<|endoftext|>)
    bos = tok.bos_token_id
    nll = []
    for t in texts:
        nll += _manual_nll(model, [bos] + enc(t), 1)
    assert perplexity(texts, model, tok) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    with pytest.raises(ValueError, match="no completion token"):
        perplexity(["", ""], model, tok, prompts=["a", "b"])
    with pytest.raises(ValueError, match="align"):
        perplexity(["a"], model, tok, prompts=["a", "b"])


def test_perplexity_of_bundled_lm_from_path():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from textrl_envs.assets import lm_path

    model = AutoModelForCausalLM.from_pretrained(lm_path()).eval()
    tok = AutoTokenizer.from_pretrained(lm_path())
    prompts, texts = ["The movie was", "The movie was"], [" great fun.", " a beautiful story."]
    by_path = perplexity(texts, lm_path(), prompts=prompts)  # loads the model and tokenizer from the folder
    assert by_path == pytest.approx(perplexity(texts, model, tok, prompts=prompts), rel=1e-6)

    def enc(s):
        return tok(s, add_special_tokens=False)["input_ids"]

    nll = _manual_nll(model, enc(prompts[1]) + enc(texts[1]), len(enc(prompts[1])))
    learned = perplexity(texts[1:], lm_path(), prompts=prompts[1:])  # the LM's own greedy continuation (manifest)
    assert learned == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)
    assert learned < 20 < len(tok) / 50  # far below a uniform guess over the vocabulary (perplexity len(tok))


def test_a_reward_tensor_that_requires_grad_is_detached():
    scores = th.tensor([0.25, -1.0], requires_grad=True) * 2
    values = call_reward(lambda _p, c: scores, ["a", "b"], ["x", "y"])
    assert values.dtype == np.float64 and values.tolist() == [0.5, -2.0]
