"""The gradient-variance penalty as GRPO computes it (each slice in its own forward) against a brute-force
reference: one forward of the whole minibatch, the K slice gradients of its surrogate one by one, flattened,
``Var = (1/K) sum_k ||g_k - g_bar||^2`` written out; value, logged figure and the loss's gradient."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch as th
from helpers import quiet
from stable_baselines3.common.callbacks import CallbackList
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_grpo import GRPO
from sb3_grpo.common.update.train_stats import TrainStats
from sb3_grpo.grpo.penalty import slice_sizes
from sb3_grpo.objectives import adaptive_clip_range, clipped_surrogate
from textrl_envs.sb3 import make_vec_env

# the penalty alone (and the clipped surrogate it is measured on); the critic's loss rides along
PENALTY = {"grad_var_coef": 0.5, "adaptive_clip": (1.1, 0.9), "explore_alpha": 0.0, "advantage": "gae", "kl_coef": 0.0}


def _first_minibatch(model, n_steps):
    model._setup_learn(n_steps * model.n_envs, None)
    callback = CallbackList([])
    callback.init_callback(model)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, n_steps)
    model.policy.set_training_mode(True)
    return next(iter(model.batch_source.minibatches(model.rollout_buffer, model.batch_size)))


def _reference(model, minibatch, clip_range):
    """Var and the full loss from ONE forward of the whole minibatch, the slice gradients taken one by one."""
    with sdpa_kernel(SDPBackend.MATH):  # the fused kernels have no double backward
        values, log_prob, entropy = model.batch_source.evaluate(minibatch)
    adv = minibatch.advantages
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    eps = adaptive_clip_range(adv, clip_range, model.adaptive_clip)
    surrogate = clipped_surrogate(th.exp(log_prob - minibatch.old_log_prob), adv, eps)
    params = [p for p in model.policy.parameters() if p.requires_grad]
    flat = []
    for part in th.tensor_split(surrogate, model.grad_var_slices):
        grads = th.autograd.grad(-part.mean(), params, create_graph=True, allow_unused=True)
        flat.append(th.cat([(th.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)]))
    g = th.stack(flat)
    var = ((g - g.mean(0)) ** 2).sum(1).mean()
    entropy_loss = -entropy.mean()
    value_loss = th.nn.functional.mse_loss(minibatch.returns, values)
    loss = -surrogate.mean() + model.ent_coef * entropy_loss + model.vf_coef * value_loss + model.grad_var_coef * var
    return var, loss


def _compare(model, minibatch, rtol):
    params = [p for p in model.policy.parameters() if p.requires_grad]
    stats = TrainStats()
    terms = model._minibatch_loss(minibatch, 0.2, None, stats)
    ours = th.autograd.grad(terms.loss, params, allow_unused=True)
    var, loss = _reference(model, minibatch, 0.2)
    theirs = th.autograd.grad(loss, params, allow_unused=True)
    assert var.item() > 0
    assert stats.grad_vars[-1] == pytest.approx(var.item(), rel=rtol)
    assert terms.loss.item() == pytest.approx(loss.item(), rel=rtol)
    scale = max(float(t.abs().max()) for t in theirs if t is not None)
    for a, b in zip(ours, theirs, strict=True):
        th.testing.assert_close(a, b, rtol=rtol, atol=rtol * scale)


def test_slice_sizes_are_tensor_splits():
    for n, k in [(10, 4), (8, 4), (5, 5), (7, 2), (1, 1)]:
        assert slice_sizes(n, k) == [len(p) for p in th.tensor_split(th.arange(n), k)]


def test_text_penalty_from_separate_slice_forwards_equals_one_forward():
    """The sequence path (packed forwards of the bundled LM): slice boundaries cut sequences, which are then
    evaluated in both slices."""
    env = make_vec_env("TextGen-v0", n_envs=4, seed=0, device="cpu", max_new_tokens=8)
    hp = {"n_steps": 12, "batch_size": 48, "n_epochs": 1, "seed": 1, "device": "cpu", "grad_var_slices": 4}
    model = quiet(GRPO("CausalLMPolicy", env, **hp, **PENALTY))
    minibatch = _first_minibatch(model, 12)
    counts = minibatch.inputs.action_mask.sum(1).cumsum(0).tolist()
    bounds = th.tensor(slice_sizes(len(minibatch.actions), 4)).cumsum(0).tolist()[:-1]
    assert any(b not in counts for b in bounds), "a slice boundary should cut a sequence"
    _compare(model, minibatch, rtol=2e-4)


@pytest.mark.parametrize(
    ("policy", "separate"), [("MlpPolicy", False), ("MlpPolicy", True), ("MultiInputPolicy", True)]
)
def test_transition_penalty_equals_one_forward(policy, separate):
    """Transitions: a small MLP takes one forward and a vectorized backward; forced, the per-slice forwards that
    large policies take (tensor and dict observations)."""
    from stable_baselines3.common.envs import SimpleMultiObsEnv

    env = "CartPole-v1" if policy == "MlpPolicy" else SimpleMultiObsEnv(random_start=False)
    hp = {"n_steps": 60, "batch_size": 30, "n_epochs": 1, "seed": 0, "device": "cpu", "grad_var_slices": 4}
    model = quiet(GRPO(policy, env, **hp, **PENALTY))
    assert model.batch_source.separate_slices == (policy != "MlpPolicy")  # CartPole's MLP is small: one forward
    model.batch_source.separate_slices = separate
    _compare(model, _first_minibatch(model, 60), rtol=1e-5)
