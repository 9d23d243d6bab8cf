"""The blocks' decoding products from other weight layouts (``sb3_grpo.policies.block_weights``): every product
served from a column-major copy or an MKL pack equals the layer's own to the bit, a group of layers that read the
same input is served as one packed product, a layout is kept only where measured fastest and equal, never serves a
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

from sb3_grpo.policies import block_weights as blocks_module
from sb3_grpo.policies.block_weights import MIN_SERVED_ROWS, MIN_SERVED_WEIGHTS, TRIAL_PRODUCTS, BlockWeights
from sb3_grpo.policies.packed_head import mkl_packing_available
from textrl_envs.sb3 import make_vec_env

#: the function each layout's products go through
PRODUCT_OF = {"column": "_column_product", "packed": "_packed_product"}
LAYOUT_PARAMS = [
    "column",
    pytest.param(
        "packed",
        marks=pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch has no MKL packed products"),
    ),
]


def _layer(out_features: int = 1024, in_features: int = 512, bias: bool = True, seed: int = 0) -> nn.Linear:
    th.manual_seed(seed)
    return nn.Linear(in_features, out_features, bias=bias)


def _only(layout: str) -> BlockWeights:
    return BlockWeights(column=layout == "column", packed=layout == "packed")


def _served_products(monkeypatch, layout: str) -> dict[str, int]:
    """Count the products served from ``layout`` (trials included)."""
    return count_calls(monkeypatch, blocks_module, PRODUCT_OF[layout])


def _skip_if_refused(blocks: BlockWeights, layout: str) -> None:
    if layout not in blocks.verdicts.values():
        pytest.skip(f"this CPU's MKL multiplies in another order from the {layout} layout (nothing is served)")


def _key(*shapes, rows: int = 32, bias: bool = True) -> tuple:
    return tuple((*s, bias) for s in shapes), rows, th.get_num_threads()


@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
def test_a_layout_measured_faster_serves_the_layers_numbers(layout, monkeypatch):
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)  # any equal layout counts as faster
    served = _served_products(monkeypatch, layout)
    blocks, layer = _only(layout), _layer()
    assert layer.weight.numel() >= MIN_SERVED_WEIGHTS and blocks.layouts == (layout,)
    key = _key((1024, 512))
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            x = th.randn(32, 512)
            assert key not in blocks.verdicts
            assert th.equal(blocks.linear(layer, x), layer(x))  # a trial: every product, the layer's returned
        _skip_if_refused(blocks, layout)
        assert blocks.verdicts == {key: layout} and served["n"] == TRIAL_PRODUCTS
        for shape in ((32, 512), (4, 8, 512), (32, 1, 512)):  # any leading shape of 32 rows
            x = th.randn(*shape)
            assert th.equal(blocks.linear(layer, x), layer(x))
        assert served["n"] == TRIAL_PRODUCTS + 3
        unbiased = _layer(bias=False)
        x = th.randn(32, 512)
        assert th.equal(blocks.linear(unbiased, x), unbiased(x))
    assert blocks.holds
    blocks.clear()
    assert not blocks.holds and blocks.verdicts[key] == layout  # the verdict outlives the tensors


@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False), (True, False, True)])
@pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch has no MKL packed products")
def test_a_group_is_packed_together_and_served_as_one_product(bias, monkeypatch):
    """A layer's query, key and value (one input, three weights) run as one product whose columns are theirs."""
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)
    served = _served_products(monkeypatch, "packed")
    group = tuple(_layer(out, bias=b, seed=i) for i, (out, b) in enumerate(zip((512, 128, 128), bias, strict=True)))
    blocks = _only("packed")
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS + 2):
            x = th.randn(2, 16, 512)
            products = blocks.project(group, x)
            assert len(products) == 3 and all(th.equal(p, m(x)) for p, m in zip(products, group, strict=True))
        _skip_if_refused(blocks, "packed")
    assert served["n"] == TRIAL_PRODUCTS + 2  # one product a call for the three layers
    assert len(blocks._held) == 1  # one pack of the three weights


def test_a_costlier_layout_is_kept_only_where_it_beats_the_cheaper_pick(monkeypatch):
    """Under a clock on which each layout's products take a set share of ``F.linear``'s time, a layout is kept where it
    takes under :data:`KEEP_BELOW` of the time of the cheaper ways' pick (``F.linear``, then the copy, then the pack),
    and none where none does."""
    real = {name: getattr(blocks_module, name) for name in PRODUCT_OF.values()}
    cases = [({"column": 0.5, "packed": 0.3}, "packed"), ({"column": 0.5, "packed": 2.0}, "column")]
    cases += [({"column": 0.5, "packed": 0.49}, "column"), ({"column": 2.0, "packed": 0.5}, "packed")]
    cases.append(({"column": 0.97, "packed": 2.0}, "plain"))
    for shares, kept in cases:
        ticks = {"now": 0.0, "share": 1.0}

        def clock(ticks=ticks):
            ticks["now"] += ticks["share"]
            ticks["share"] = 1.0
            return ticks["now"]

        for layout, name in PRODUCT_OF.items():

            def product(*args, ticks=ticks, share=shares[layout], real_product=real[name]):
                ticks["share"] = share
                return real_product(*args)

            monkeypatch.setattr(blocks_module, name, product)
        monkeypatch.setattr(blocks_module, "_clock", clock)
        blocks, layer = BlockWeights(), _layer()
        if blocks.layouts != ("column", "packed"):
            pytest.skip("this PyTorch has no MKL packed products")
        with th.no_grad():
            for _ in range(TRIAL_PRODUCTS):
                blocks.linear(layer, th.randn(32, 512))
        verdict = blocks.verdicts[_key((1024, 512))]
        if verdict != kept:  # a layout refused as unequal on this CPU: the verdict is another
            assert verdict in ("plain", *shares)
            pytest.skip("this CPU's MKL multiplies in another order from one of the layouts")
        assert blocks.holds == (kept != "plain")


@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
def test_a_slower_layout_is_dropped_and_never_tried_again(layout, monkeypatch):
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 0.0)  # nothing is fast enough
    served = _served_products(monkeypatch, layout)
    blocks, layer = _only(layout), _layer()
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            blocks.linear(layer, th.randn(32, 512))
        assert blocks.verdicts == {_key((1024, 512)): "plain"}
        x = th.randn(32, 512)
        assert th.equal(blocks.linear(layer, x), layer(x))
    assert served["n"] <= TRIAL_PRODUCTS and not blocks.holds  # the tensors' memory is free again


def test_a_product_unequal_to_the_layers_is_refused(monkeypatch):
    """A layout whose product differs by a bit is out at its first trial; the others go on."""
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)
    real = blocks_module._column_product
    monkeypatch.setattr(blocks_module, "_column_product", lambda x, c, b: real(x, c, b) + 1e-3)
    blocks, layer = _only("column"), _layer()
    x = th.randn(32, 512)
    with th.no_grad():
        assert th.equal(blocks.linear(layer, x), layer(x))  # the layer's product, not the copy's
        assert list(blocks.verdicts.values()) == ["plain"]  # at the first trial: no layout left
        assert th.equal(blocks.linear(layer, x), layer(x))
        assert not blocks.holds
        nan = x.clone()
        nan[0, 0] = float("nan")  # non-finite inputs prove nothing: a new row count is still tried
        assert not th.isfinite(blocks.linear(layer, nan[:20])).all()
        assert _key((1024, 512), rows=20) not in blocks.verdicts
    if not mkl_packing_available():
        return
    blocks = BlockWeights()
    with th.no_grad():
        blocks.linear(layer, x)
        assert blocks._trials[_key((1024, 512))].keys() == {"plain", "packed"}  # the copy is out, the pack goes on
        assert {slot[1] for slot in blocks._held} == {"packed"}


@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
def test_a_changed_weight_is_laid_out_anew(layout, monkeypatch):
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)
    blocks, layer = _only(layout), _layer()
    with th.no_grad():
        for _ in range(TRIAL_PRODUCTS):
            blocks.linear(layer, th.randn(32, 512))
        _skip_if_refused(blocks, layout)
        x = th.randn(32, 512)
        layer.weight.mul_(-2.0)  # an in-place update (optimizer.step, load_state_dict) bumps the tensor's version
        assert th.equal(blocks.linear(layer, x), layer(x))
        layer.weight = nn.Parameter(th.randn(1024, 512))  # another tensor of the same shape
        assert th.equal(blocks.linear(layer, x), layer(x))
        layer.bias.add_(1.0)  # a pack's stacked bias is read at each call
        assert th.equal(blocks.linear(layer, x), layer(x))


@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
def test_serves_nothing_with_gradients_autocast_few_rows_or_other_layers(layout, monkeypatch):
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)
    served = _served_products(monkeypatch, layout)
    blocks, layer = _only(layout), _layer()

    class Scaled(nn.Linear):  # a subclass may compute otherwise
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = Scaled(512, 1024)
    x = th.randn(32, 512)
    assert th.equal(blocks.linear(layer, x), layer(x))  # gradients enabled: the update's forward
    with th.no_grad():
        assert th.equal(blocks.linear(layer, x[: MIN_SERVED_ROWS - 1]), layer(x[: MIN_SERVED_ROWS - 1]))
        assert th.equal(blocks.linear(scaled, x), scaled(x))
        small = nn.Linear(64, 64)
        assert th.equal(blocks.linear(small, x[:, :64]), small(x[:, :64]))
        wide = _layer().double()
        assert th.equal(blocks.linear(wide, x.double()), wide(x.double()))
        with th.autocast("cpu", dtype=th.bfloat16):
            assert th.equal(blocks.linear(layer, x), layer(x))
        strided = _layer()
        strided.weight = nn.Parameter(th.randn(512, 1024).t())  # not contiguous
        assert th.equal(blocks.linear(strided, x), strided(x))
    assert served["n"] == 0 and not blocks.holds and not blocks.verdicts
    with th.no_grad():  # a group with a layer it does not serve: the others are served one by one
        products = blocks.project((scaled, layer), x)
    assert th.equal(products[0], scaled(x)) and th.equal(products[1], layer(x))
    assert list(blocks._trials) == [_key((1024, 512))] and served["n"] == 1


def test_nothing_is_served_with_every_layout_off(monkeypatch):
    blocks, layer = BlockWeights(column=False, packed=False), _layer()
    x = th.randn(32, 512)
    with th.no_grad():
        assert th.equal(blocks.linear(layer, x), layer(x))
    assert blocks.layouts == () and not blocks.verdicts and not blocks.holds


def _tiny_llama(vocab: int) -> LlamaForCausalLM:
    """A 2-layer Llama with projections of 128 x 128 to 128 x 256 (the bundled LM is a GPT-2, whose step multiplies
    its weights itself)."""
    th.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                      eos_token_id=EOS, pad_token_id=0)  # fmt: skip
    return LlamaForCausalLM(cfg)


def _rollout_buffers(layouts: tuple[str, ...], lora: dict | None = None):
    env = make_vec_env("TextGen-v0", n_envs=16, group_size=4, seed=5, device="cpu", max_new_tokens=6)
    kwargs = {"model": _tiny_llama(int(env.action_space.n)), "lora": lora}
    kwargs.update(column_major_weights="column" in layouts, pack_block_weights="packed" in layouts)
    model, rollouts = logged_rollouts(env, 8, 64, seed=2, engine="step", policy_kwargs=kwargs)
    return rollouts, model.policy


#: LoRA on the attention projections, as the real-model guide trains: the MLP's plain layers are still served
ATTENTION_LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


@pytest.mark.parametrize("layout", LAYOUT_PARAMS)
@pytest.mark.parametrize("lora", [None, ATTENTION_LORA], ids=["full", "lora"])
def test_rollouts_with_other_weight_layouts_equal_those_without(lora, layout, monkeypatch):
    if lora is not None:
        pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install peft)")
    monkeypatch.setattr(blocks_module, "MIN_SERVED_WEIGHTS", 0)  # the tiny Llama's layers are small
    monkeypatch.setattr(blocks_module, "KEEP_BELOW", 1e9)  # keep an equal layout, however fast
    served = _served_products(monkeypatch, layout)
    with_layout, policy = _rollout_buffers((layout,), lora)
    n_served = served["n"]
    plain, without = _rollout_buffers((), lora)
    assert without._block_weights is None and served["n"] == n_served
    verdicts = policy._block_weights.verdicts
    if layout in verdicts.values():  # (a CPU whose MKL multiplies otherwise serves nothing)
        assert n_served > TRIAL_PRODUCTS * 4
    tried = {tuple(shape[:2] for shape in key[0]) for key in verdicts}  # the decoding steps' products were tried
    mlp = {((256, 128), (256, 128)), ((128, 256),)}  # (gate and up, down)
    attention = {((128, 128), (64, 128), (64, 128)), ((128, 128),)}  # (query, key and value; output)
    assert tried == (mlp if lora else mlp | attention)  # the adapted layers run peft's forward
    assert not policy._block_weights.holds  # dropped before the update, the update's memory as without it
    assert_rollouts_equal_to_the_bit(with_layout, plain)


def test_the_policy_serves_the_layouts_to_its_lean_step_on_the_cpu_only(monkeypatch):
    from test_policies import make_policy, tiny_llama

    policy = make_policy(tiny_llama())
    assert policy._projection() == policy._block_weights.project
    assert policy._block_weights.layouts == (("column", "packed") if mkl_packing_available() else ("column",))
    assert make_policy(tiny_llama(), pack_block_weights=False)._block_weights.layouts == ("column",)
    assert make_policy(tiny_llama(), column_major_weights=False, pack_block_weights=False)._projection() is None
    assert make_policy(tiny_llama(), autocast_dtype="bfloat16")._projection() is None  # autocast's own products
    monkeypatch.setattr(type(policy), "device", property(lambda self: th.device("cuda")))
    assert policy._projection() is None  # a GPU: no MKL, and the lean step's host time counts
