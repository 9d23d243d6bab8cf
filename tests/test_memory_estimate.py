"""The memory estimate against a hand computation for a tiny GPT-2 config, its parameter counts against a real model
built from the same config, and the ``sb3-grpo estimate-memory`` command."""

from __future__ import annotations

import json

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from sb3_grpo.cli import main
from sb3_grpo.policies.memory_estimate import MODEL_SHAPES, estimate_memory, load_config, model_counts

L, D, V, P = 2, 32, 64, 64  # blocks, width, vocabulary, positions
TINY = {"model_type": "gpt2", "n_layer": L, "n_embd": D, "n_head": 2, "vocab_size": V, "n_positions": P}


def _config():
    return GPT2Config(n_layer=L, n_embd=D, n_head=2, vocab_size=V, n_positions=P)


def test_counts_match_the_hand_count_and_a_real_model():
    counts = model_counts(_config(), ["c_attn"])
    # by hand: token and position embeddings, per block two norms (2D each), c_attn D x 3D + 3D, attn c_proj
    # D x D + D, c_fc D x 4D + 4D, mlp c_proj 4D x D + D; the final norm; the head is tied to the token embedding
    block = 2 * 2 * D + (3 * D * D + 3 * D) + (D * D + D) + (4 * D * D + 4 * D) + (4 * D * D + D)
    assert counts.total == V * D + P * D + L * block + 2 * D
    real = GPT2LMHeadModel(_config())
    assert counts.total == sum(p.numel() for p in real.parameters())  # (parameters() lists tied ones once)
    assert counts.block == L * block and counts.largest_block == block
    assert counts.quantizable == L * 12 * D * D and counts.quantizable_rows == L * (3 * D + D + 4 * D + D)
    assert counts.lora_per_rank == L * (D + 3 * D)  # c_attn: in D, out 3D
    assert (counts.layers, counts.width, counts.kv_width, counts.inner, counts.gated) == (L, D, D, 4 * D, False)


def test_estimate_matches_the_hand_computation():
    counts = model_counts(_config(), ["c_attn"])
    n = counts.total
    head = D + 1
    m, s = 3, 10
    act = m * s * (L * (8 * D + 2 * D + 2 * 4 * D)) * 4 + m * s * 3 * V * 4

    full = estimate_memory(counts, micro_batch_size=m, seq_len=s, kl_reference=True)
    assert full.weights == (n + head) * 4 and full.gradients == (n + head) * 4 and full.adam == 2 * (n + head) * 4
    assert full.kl_reference == n * 4 and full.activations == act and full.fsdp_gathered == 0
    assert full.total == 4 * (n + head) * 4 + n * 4 + act

    r = 4
    lora = estimate_memory(counts, lora_rank=r, micro_batch_size=m, seq_len=s, kl_reference=True)
    adapters = r * L * (D + 3 * D)
    assert lora.trainable == adapters + head and lora.params == n + adapters + head
    assert lora.weights == (n + head + adapters) * 4 and lora.gradients == (adapters + head) * 4
    assert lora.adam == 2 * (adapters + head) * 4 and lora.kl_reference == 0  # the reference: adapters off

    q = L * 12 * D * D
    rows = L * 9 * D
    eight = estimate_memory(counts, lora_rank=r, quantization="8bit", micro_batch_size=m, seq_len=s)
    assert eight.weights == int((n - q) * 4 + q + rows * 4 + head * 4 + adapters * 4)
    four = estimate_memory(counts, lora_rank=r, quantization="4bit", micro_batch_size=m, seq_len=s)
    assert four.weights == int((n - q) * 4 + q / 2 + q / 64 + q / 64 / 256 * 4 + head * 4 + adapters * 4)

    ckpt = estimate_memory(
        counts, micro_batch_size=m, seq_len=s, gradient_checkpointing=True, autocast_dtype="bfloat16"
    )
    assert ckpt.activations == m * s * (L * D + 18 * D) * 2 + m * s * 3 * V * 4

    block = counts.largest_block
    fsdp = estimate_memory(counts, micro_batch_size=m, seq_len=s, fsdp=2)
    held = counts.block / 2 + (n - counts.block)
    assert fsdp.weights == int(held * 4 + head * 4) and fsdp.adam == int(2 * (held * 4 + head * 4))
    assert fsdp.fsdp_gathered == block * 4 * 2
    # fewer actions than the vocabulary: only their logits
    small = estimate_memory(counts, micro_batch_size=m, seq_len=s, n_actions=10)
    assert full.activations - small.activations == m * s * 3 * (V - 10) * 4


def test_bad_settings_are_refused():
    counts = model_counts(_config(), ["c_attn"])
    with pytest.raises(ValueError, match="quantization needs LoRA"):
        estimate_memory(counts, quantization="4bit")
    with pytest.raises(ValueError, match="fsdp=1"):
        estimate_memory(counts, lora_rank=4, quantization="4bit", fsdp=2)
    with pytest.raises(ValueError, match="dtype"):
        estimate_memory(counts, dtype="float64")
    with pytest.raises(ValueError, match="not a known shape"):
        load_config("no/such-model-here")


def test_named_shapes_have_their_published_sizes():
    sizes = {name: model_counts(load_config(name)).total for name in MODEL_SHAPES}
    assert round(sizes["gpt2-small"] / 1e6, 1) == 124.4
    assert round(sizes["qwen2-0.5b"] / 1e6) == 494 and round(sizes["qwen2-1.5b"] / 1e6) == 1544


def test_command_prints_and_writes_the_estimate(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    out = tmp_path / "est.json"
    argv = ["estimate-memory", "--model", str(path), "--lora", "4", "--lora-targets", "c_attn", "--seq-len", "10"]
    assert main([*argv, "--micro-batch-size", "3", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "LoRA r=4, micro 3" in text and "LoRA r=4, micro 1" in text
    figures = json.loads(out.read_text())
    counts = model_counts(_config(), ["c_attn"])
    expected = estimate_memory(counts, lora_rank=4, micro_batch_size=3, seq_len=10).as_mb()
    assert figures["LoRA r=4, micro 3"] == pytest.approx(expected)
    assert main(["estimate-memory", "--model", str(path), "--compare", "--lora-targets", "c_attn"]) == 0
    assert "LoRA + 4-bit" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate-memory", "--model", str(path), "--quant", "4bit"])
    assert "--quant needs --lora" in capsys.readouterr().err
