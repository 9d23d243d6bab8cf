"""The output layer packed for MKL (``sb3_grpo.policies.packed_head``): every product it serves equals ``F.linear``
to the bit, it never serves a weight that changed since it was packed, it stays out of gradients, small layers and
one-off row counts, and a rollout with it equals a rollout without it, bit for bit, on both engines."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from test_engines import assert_rollouts_equal_to_the_bit, count_calls, logged_rollouts
from torch.nn import functional as F

from sb3_grpo.policies import packed_head as packed_module
from sb3_grpo.policies.packed_head import MIN_PACKED_WEIGHTS, PackedHead, mkl_packing_available
from textrl_envs.sb3 import make_vec_env

pytestmark = pytest.mark.skipif(
    not mkl_packing_available(), reason="this PyTorch has no MKL packed products (not an x86 build with MKL)"
)


def _weights(rows: int = 2048, cols: int = 512) -> th.Tensor:
    th.manual_seed(0)
    return th.randn(rows, cols)


def test_packs_on_a_repeated_row_count_and_serves_linears_numbers():
    head, weight, bias = PackedHead(), _weights(), th.randn(2048)
    assert weight.numel() >= MIN_PACKED_WEIGHTS
    x, y = th.randn(32, 512), th.randn(32, 512)
    with th.no_grad():
        assert head.linear(x, weight, bias) is None  # a row count seen once: maybe a prefill
        assert not head.holds
        assert th.equal(head.linear(x, weight, bias), F.linear(x, weight, bias))  # packed here, checked
        assert head.holds
        assert th.equal(head.linear(y, weight, bias), F.linear(y, weight, bias))  # served by the pack
        assert head.linear(th.randn(48, 512), weight, bias) is None  # a one-off row count keeps the pack
        assert head.holds
        assert th.equal(head.linear(x, weight, None), F.linear(x, weight))
    head.clear()
    assert not head.holds


def test_a_changed_weight_is_packed_anew():
    head, weight = PackedHead(), _weights()
    x = th.randn(32, 512)
    with th.no_grad():
        head.linear(x, weight, None)
        head.linear(x, weight, None)
        assert head.holds
        weight.mul_(-2.0)  # an in-place update (optimizer.step, load_state_dict) bumps the tensor's version
        assert th.equal(head.linear(x, weight, None), F.linear(x, weight))
        other = _weights() + 1.0  # another tensor of the same shape
        assert th.equal(head.linear(x, other, None), F.linear(x, other))


def test_serves_nothing_with_gradients_small_layers_or_other_dtypes():
    head, weight = PackedHead(), _weights()
    x = th.randn(32, 512)
    for _ in range(2):
        assert head.linear(x, weight, None) is None  # gradients enabled: the update's forward
    with th.no_grad():
        small = th.randn(64, 32)
        for _ in range(2):
            assert head.linear(th.randn(32, 32), small, None) is None
            assert head.linear(x.double(), weight.double(), None) is None
            assert head.linear(x[:, None], weight, None) is None
    assert not head.holds


def test_a_product_unequal_to_linear_is_refused_for_its_row_count(monkeypatch):
    head, weight = PackedHead(), _weights()
    x = th.randn(32, 512)
    monkeypatch.setattr(packed_module, "_packed_product", lambda h, p, w, b, r: F.linear(h, w, b) + 1e-3)
    with th.no_grad():
        head.linear(x, weight, None)
        assert th.equal(head.linear(x, weight, None), F.linear(x, weight))  # the plain product, not the packed one
        assert not head.holds and head.refused == {((2048, 512), 32)}
        assert head.linear(x, weight, None) is None  # never tried again


def _rollout_buffers(engine: str, pack: bool):
    env = make_vec_env("TextGen-v0", n_envs=16, group_size=4, seed=5, device="cpu", max_new_tokens=6)
    model, rollouts = logged_rollouts(env, 8, 64, seed=2, engine=engine, policy_kwargs={"pack_output_layer": pack})
    return rollouts, model.policy


@pytest.mark.parametrize("engine", ["step", "hf"])
def test_rollouts_with_the_packed_output_layer_equal_those_without(engine, monkeypatch):
    monkeypatch.setattr(packed_module, "MIN_PACKED_WEIGHTS", 0)  # the bundled LM's output layer is small
    served = count_calls(monkeypatch, packed_module, "_packed_product")
    packed, policy = _rollout_buffers(engine, True)
    plain, unpacked = _rollout_buffers(engine, False)
    assert unpacked._packed_head is None
    if not policy._packed_head.refused:  # (a CPU whose MKL takes another kernel for this shape packs nothing)
        assert served["n"] > 8
    assert not policy._packed_head.holds  # dropped before the update, the update's memory as without it
    assert_rollouts_equal_to_the_bit(packed, plain)
