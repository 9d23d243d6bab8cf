"""Column-major weight copies for the decoding products (``sb3_grpo.policies.column_weights``): every product served
from a copy equals the layer's own to the bit, a copy is kept only where measured faster and equal, never serves a
weight that changed since it was made, stays out of gradients, autocast, few rows and other layers, and a rollout
with it equals a rollout without it, bit for bit."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from test_engines import assert_rollouts_equal_to_the_bit, count_calls, logged_rollouts
from test_policies import EOS
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from sb3_grpo.policies import column_weights as column_module
from sb3_grpo.policies.column_weights import MIN_COLUMN_ROWS, MIN_COLUMN_WEIGHTS, TRIAL_PRODUCTS, ColumnWeights
from textrl_envs.sb3 import make_vec_env


def _layer(out_features: int = 1024, in_features: int = 512, bias: bool = True) -> nn.Linear:
    th.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias)


def _served_products(monkeypatch) -> dict[str, int]:
    """Count the products served from a copy (trials included)."""
    return count_calls(monkeypatch, column_module, "_column_product")


def test_a_copy_measured_faster_serves_the_layers_numbers(monkeypatch):
    monkeypatch.setattr(column_module, "KEEP_BELOW", 1e9)  # any equal copy counts as faster
    served = _served_products(monkeypatch)
    columns, layer = ColumnWeights(), _layer()
    assert layer.weight.numel() >= MIN_COLUMN_WEIGHTS
    key = (1024, 512, 32, th.get_num_threads())
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            x = th.randn(32, 512)
            assert key not in columns.verdicts
            assert th.equal(columns.linear(layer, x), layer(x))  # a trial: both products, the layer's returned
        if columns.verdicts[key] is False:
            pytest.skip("this CPU's MKL multiplies a column-major weight in another order (nothing is served)")
        assert columns.verdicts == {key: True} and served["n"] == TRIAL_PRODUCTS
        for shape in ((32, 512), (4, 8, 512), (32, 1, 512)):  # any leading shape of 32 rows
            x = th.randn(*shape)
            assert th.equal(columns.linear(layer, x), layer(x))
        assert served["n"] == TRIAL_PRODUCTS + 3
        unbiased = _layer(bias=False)
        x = th.randn(32, 512)
        assert th.equal(columns.linear(unbiased, x), unbiased(x))
    assert columns.holds
    columns.clear()
    assert not columns.holds and columns.verdicts[key] is True  # the verdict outlives the copies


def test_a_slower_copy_is_dropped_and_never_tried_again(monkeypatch):
    monkeypatch.setattr(column_module, "KEEP_BELOW", 0.0)  # no copy is fast enough
    served = _served_products(monkeypatch)
    columns, layer = ColumnWeights(), _layer()
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            columns.linear(layer, th.randn(32, 512))
        assert columns.verdicts == {(1024, 512, 32, th.get_num_threads()): False}
        x = th.randn(32, 512)
        assert th.equal(columns.linear(layer, x), layer(x))
    assert served["n"] == TRIAL_PRODUCTS and not columns.holds  # the copy's memory is free again


def test_the_trials_time_both_products_and_keep_the_faster(monkeypatch):
    """A clock under which the copy's products take half the time: kept; twice the time: not kept."""
    real = column_module._column_product
    for column_share, kept in ((0.5, True), (2.0, False)):
        ticks = {"now": 0.0, "column": False}

        def column_product(*args, ticks=ticks):
            ticks["column"] = True
            return real(*args)

        def clock(ticks=ticks, share=column_share):
            ticks["now"] += share if ticks["column"] else 1.0
            ticks["column"] = False
            return ticks["now"]

        monkeypatch.setattr(column_module, "_column_product", column_product)
        monkeypatch.setattr(column_module, "_clock", clock)
        columns, layer = ColumnWeights(), _layer()
        with th.no_grad():
            for _ in range(TRIAL_PRODUCTS):
                columns.linear(layer, th.randn(32, 512))
        if not any(columns.verdicts.values()) and kept:
            x = th.randn(32, 512)  # refused as unequal on this CPU, or slower: tell the two apart
            assert not th.equal(real(x, layer.weight.t().contiguous(), layer.bias), layer(x))
            pytest.skip("this CPU's MKL multiplies a column-major weight in another order (nothing is served)")
        assert list(columns.verdicts.values()) == [kept]


def test_a_product_unequal_to_the_layers_is_refused(monkeypatch):
    monkeypatch.setattr(column_module, "KEEP_BELOW", 1e9)
    monkeypatch.setattr(column_module, "_column_product", lambda x, c, b: th.nn.functional.linear(x, c.t(), b) + 1e-3)
    columns, layer = ColumnWeights(), _layer()
    x = th.randn(32, 512)
    with th.no_grad():
        assert th.equal(columns.linear(layer, x), layer(x))  # the layer's product, not the copy's
        assert list(columns.verdicts.values()) == [False]  # at the first trial
        assert th.equal(columns.linear(layer, x), layer(x))
        assert not columns.holds
        nan = x.clone()
        nan[0, 0] = float("nan")  # non-finite inputs prove nothing: a new row count is still tried
        assert not th.isfinite(columns.linear(layer, nan[:20])).all()
        assert (1024, 512, 20, th.get_num_threads()) not in columns.verdicts


def test_a_changed_weight_is_copied_anew(monkeypatch):
    monkeypatch.setattr(column_module, "KEEP_BELOW", 1e9)
    columns, layer = ColumnWeights(), _layer()
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            columns.linear(layer, th.randn(32, 512))
        if not any(columns.verdicts.values()):
            pytest.skip("this CPU's MKL multiplies a column-major weight in another order (nothing is served)")
        x = th.randn(32, 512)
        layer.weight.mul_(-2.0)  # an in-place update (optimizer.step, load_state_dict) bumps the tensor's version
        assert th.equal(columns.linear(layer, x), layer(x))
        layer.weight = nn.Parameter(th.randn(1024, 512))  # another tensor of the same shape
        assert th.equal(columns.linear(layer, x), layer(x))


def test_serves_nothing_with_gradients_autocast_few_rows_or_other_layers(monkeypatch):
    monkeypatch.setattr(column_module, "KEEP_BELOW", 1e9)
    served = _served_products(monkeypatch)
    columns, layer = ColumnWeights(), _layer()

    class Scaled(nn.Linear):  # a subclass may compute otherwise
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = Scaled(512, 1024)
    x = th.randn(32, 512)
    assert th.equal(columns.linear(layer, x), layer(x))  # gradients enabled: the update's forward
    with th.no_grad():
        assert th.equal(columns.linear(layer, x[: MIN_COLUMN_ROWS - 1]), layer(x[: MIN_COLUMN_ROWS - 1]))
        assert th.equal(columns.linear(scaled, x), scaled(x))
        small = nn.Linear(64, 64)
        assert th.equal(columns.linear(small, x[:, :64]), small(x[:, :64]))
        wide = _layer().double()
        assert th.equal(columns.linear(wide, x.double()), wide(x.double()))
        with th.autocast("cpu", dtype=th.bfloat16):
            assert th.equal(columns.linear(layer, x), layer(x))
        strided = _layer()
        strided.weight = nn.Parameter(th.randn(512, 1024).t())  # not contiguous
        assert th.equal(columns.linear(strided, x), strided(x))
    assert served["n"] == 0 and not columns.holds and not columns.verdicts


def _tiny_llama(vocab: int) -> LlamaForCausalLM:
    """A 2-layer Llama with projections of 128 x 128 to 128 x 256 (the bundled LM is a GPT-2, whose step multiplies
    its weights itself)."""
    th.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                      eos_token_id=EOS, pad_token_id=0)  # fmt: skip
    return LlamaForCausalLM(cfg)


def _rollout_buffers(columns: bool, lora: dict | None = None):
    env = make_vec_env("TextGen-v0", n_envs=16, group_size=4, seed=5, device="cpu", max_new_tokens=6)
    kwargs = {"model": _tiny_llama(int(env.action_space.n)), "column_major_weights": columns, "lora": lora}
    model, rollouts = logged_rollouts(env, 8, 64, seed=2, engine="step", policy_kwargs=kwargs)
    return rollouts, model.policy


#: LoRA on the attention projections, as the real-model guide trains: the MLP's plain layers are still served
ATTENTION_LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


@pytest.mark.parametrize("lora", [None, ATTENTION_LORA], ids=["full", "lora"])
def test_rollouts_with_column_major_weights_equal_those_without(lora, monkeypatch):
    if lora is not None:
        pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install peft)")
    monkeypatch.setattr(column_module, "MIN_COLUMN_WEIGHTS", 0)  # the tiny Llama's layers are small
    monkeypatch.setattr(column_module, "KEEP_BELOW", 1e9)  # keep every equal copy, however fast
    served = _served_products(monkeypatch)
    with_columns, policy = _rollout_buffers(True, lora)
    n_served = served["n"]
    plain, without = _rollout_buffers(False, lora)
    assert without._column_weights is None and served["n"] == n_served
    if any(policy._column_weights.verdicts.values()):  # (a CPU whose MKL multiplies otherwise serves nothing)
        assert n_served > TRIAL_PRODUCTS * 4
    tried = {key[:2] for key in policy._column_weights.verdicts}  # the decoding steps' products were tried
    mlp = {(256, 128), (128, 256)}  # (gate and up, down)
    assert tried == (mlp if lora else mlp | {(128, 128), (64, 128)})  # the adapted layers run peft's forward
    assert not policy._column_weights.holds  # dropped before the update, the update's memory as without it
    assert_rollouts_equal_to_the_bit(with_columns, plain)


def test_the_policy_serves_the_copies_to_its_lean_step_on_the_cpu_only(monkeypatch):
    from test_policies import make_policy, tiny_llama

    policy = make_policy(tiny_llama())
    assert policy._projection() == policy._column_weights.linear
    assert make_policy(tiny_llama(), column_major_weights=False)._projection() is None
    assert make_policy(tiny_llama(), autocast_dtype="bfloat16")._projection() is None  # autocast's own products
    monkeypatch.setattr(type(policy), "device", property(lambda self: th.device("cuda")))
    assert policy._projection() is None  # a GPU: no MKL, and the lean step's host time counts
