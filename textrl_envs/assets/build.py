"""Rebuild the bundled tokenizer, tiny causal LM and sentiment classifier.

Usage::

    python -m textrl_envs.assets.build [--out DIR] [--steps N] [--seed S] [--threads T]

The build is deterministic: the same ``--seed``, ``--steps`` and ``--threads`` (and the same
torch/tokenizers versions) give the same tokenizer files and the same weights. It writes
``tokenizer/``, ``lm/``, ``classifier/`` and ``MANIFEST.json`` under ``--out`` (by default the
package's own assets folder) and runs in a few minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from textrl_envs.assets import corpus

ASSETS_DIR = Path(__file__).resolve().parent
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
DIGIT_TOKENS = [str(d) for d in range(10)] + [f" {d}" for d in range(10)]
BUILD_COMMAND = "python -m textrl_envs.assets.build"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    :param argv: arguments, ``sys.argv[1:]`` when ``None``
    :return: the parsed options
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out",
        default=str(ASSETS_DIR),
        help="output folder (default: the package assets)",
    )
    p.add_argument("--steps", type=int, default=600, help="LM training steps")
    p.add_argument("--clf-steps", type=int, default=300, help="classifier training steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus and of torch")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1 is robust on a shared machine; the weights depend on it)",
    )
    p.add_argument("--docs", type=int, default=40000, help="corpus documents for LM training")
    p.add_argument("--vocab-size", type=int, default=1600, help="BPE vocabulary size")
    p.add_argument("--batch-size", type=int, default=32, help="LM batch size (sequences)")
    p.add_argument("--seq-len", type=int, default=128, help="LM training sequence length")
    p.add_argument("--lr", type=float, default=3e-3, help="LM peak learning rate")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def train_tokenizer(texts: Sequence[str], vocab_size: int, max_length: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    Numbers are split into single digits; a digit keeps its leading space (``" 7"``) so
    space-separated number lists stay short. ``<|endoftext|>`` is BOS and EOS, ``<|pad|>`` pads.

    :param texts: training documents
    :param vocab_size: target vocabulary size, special tokens included
    :param max_length: ``model_max_length`` of the wrapped tokenizer
    :return: the tokenizer
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # isolate every digit, with its optional leading space: "12 34" -> "1", "2", " 3", "4"
            pre_tokenizers.Split(Regex(r" ?\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    check_digits(fast)
    return fast


def check_digits(tokenizer) -> None:
    """Raise if a digit or a space-digit is not a single token.

    :param tokenizer: a Hugging Face tokenizer
    :raises RuntimeError: naming the missing tokens
    """
    missing = [d for d in DIGIT_TOKENS if len(tokenizer(d, add_special_tokens=False)["input_ids"]) != 1]
    if missing:
        raise RuntimeError(
            f"digit tokens {missing!r} are not single tokens; grow the corpus number share or the vocabulary"
        )


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def token_stream(tokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate documents, each followed by EOS.

    :param tokenizer: the tokenizer
    :param texts: documents
    :return: ``(ids, starts)``: the 1-D token stream and the index of each document's first token
    """
    eos = tokenizer.eos_token_id
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    starts: list[int] = []
    for doc in encoded:
        starts.append(len(ids))
        ids.extend(doc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(starts, dtype=torch.long)


def sample_windows(
    ids: torch.Tensor,
    starts: torch.Tensor,
    batch_size: int,
    seq_len: int,
    gen: torch.Generator,
) -> torch.Tensor:
    """Draw training windows that begin at a document start.

    Starting at a document (not after an EOS) matches how prompts are fed at inference.

    :param ids: the token stream
    :param starts: document start indices
    :param batch_size: windows per batch
    :param seq_len: tokens per window
    :param gen: the torch generator
    :return: ``(batch_size, seq_len)`` token ids
    """
    valid = starts[starts <= len(ids) - seq_len]
    pick = valid[torch.randint(len(valid), (batch_size,), generator=gen)]
    offsets = pick[:, None] + torch.arange(seq_len)[None, :]
    return ids[offsets]


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of the peak.

    :param step: current step (0-based)
    :param total: total steps
    :param peak: peak learning rate
    :param warmup: warm-up steps
    :return: the learning rate
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------------------------
# Language model
# --------------------------------------------------------------------------------------------


def lm_config(tokenizer, seq_len: int):
    """The tiny GPT-2 configuration.

    :param tokenizer: the tokenizer (its ``len`` is the vocabulary size)
    :param seq_len: ``n_positions``
    :return: a ``GPT2Config``
    """
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=seq_len,
        n_embd=128,
        n_layer=4,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def evaluate_lm(
    model,
    ids: torch.Tensor,
    starts: torch.Tensor,
    seq_len: int,
    batches: int = 8,
    batch_size: int = 32,
) -> float:
    """Mean next-token loss on held-out windows.

    :param model: the causal LM
    :param ids: held-out token stream
    :param starts: its document starts
    :param seq_len: window length
    :param batches: number of batches
    :param batch_size: windows per batch
    :return: the mean loss
    """
    gen = torch.Generator().manual_seed(12345)
    model.eval()
    losses = []
    with torch.no_grad():
        for _ in range(batches):
            x = sample_windows(ids, starts, batch_size, seq_len, gen)
            losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def train_lm(tokenizer, texts: Sequence[str], args: argparse.Namespace) -> tuple[object, dict]:
    """Pretrain the tiny GPT-2 on the corpus.

    :param tokenizer: the tokenizer
    :param texts: corpus documents
    :param args: build options
    :return: ``(model, stats)``
    """
    from transformers import GPT2LMHeadModel

    n_val = max(200, len(texts) // 50)
    train_ids, train_starts = token_stream(tokenizer, texts[:-n_val])
    val_ids, val_starts = token_stream(tokenizer, texts[-n_val:])
    print(
        f"[lm] corpus tokens: train {len(train_ids)}, held-out {len(val_ids)}",
        flush=True,
    )

    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(lm_config(tokenizer, args.seq_len))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[lm] parameters: {n_params}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.01},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.98),
    )
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(1, args.steps // 20)
    recent: list[float] = []
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup)
        x = sample_windows(train_ids, train_starts, args.batch_size, args.seq_len, gen)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent.append(loss.item())
        recent = recent[-50:]
        if step == 9 or (step + 1) % 100 == 0 or step + 1 == args.steps:
            rate = (step + 1) / (time.time() - t0)
            eta = (args.steps - step - 1) / rate
            print(
                f"[lm] step {step + 1}/{args.steps} loss {sum(recent) / len(recent):.3f} "
                f"({rate:.2f} steps/s, eta {eta:.0f}s)",
                flush=True,
            )
    val_loss = evaluate_lm(model, val_ids, val_starts, args.seq_len)
    stats = {
        "parameters": n_params,
        "train_tokens": len(train_ids),
        "final_train_loss": round(sum(recent) / len(recent), 4),
        "heldout_loss": round(val_loss, 4),
        "seconds": round(time.time() - t0, 1),
    }
    print(f"[lm] held-out loss {val_loss:.3f}", flush=True)
    return model, stats


def save_lm(model, tokenizer, path: Path) -> None:
    """Save the LM (safetensors, fp32) and its generation config.

    :param model: the causal LM
    :param tokenizer: the tokenizer
    :param path: output folder
    """
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=48,
    )
    model.save_pretrained(str(path), safe_serialization=True)


# --------------------------------------------------------------------------------------------
# Sentiment classifier
# --------------------------------------------------------------------------------------------


def classifier_config(tokenizer, max_len: int):
    """The tiny GPT-2 sequence classifier configuration.

    :param tokenizer: the tokenizer
    :param max_len: ``n_positions``
    :return: a ``GPT2Config`` with two labels
    """
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=max_len,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        num_labels=2,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_batch(tokenizer, texts: Sequence[str], max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded, truncated batch encoding.

    :param tokenizer: the tokenizer
    :param texts: texts
    :param max_len: truncation length
    :return: ``input_ids`` and ``attention_mask`` tensors
    """
    return tokenizer(
        list(texts),
        padding=True,
        truncation=True,
        max_length=max_len,
        return_tensors="pt",
    )


def classifier_accuracy(model, tokenizer, pairs: Sequence[tuple[str, int]], max_len: int) -> float:
    """Accuracy on labelled pairs.

    :param model: the sequence classifier
    :param tokenizer: the tokenizer
    :param pairs: ``(text, label)`` pairs
    :param max_len: truncation length
    :return: the fraction classified correctly
    """
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(pairs), 256):
            chunk = pairs[i : i + 256]
            batch = encode_batch(tokenizer, [t for t, _ in chunk], max_len)
            pred = model(**batch).logits.argmax(-1)
            correct += int((pred == torch.tensor([y for _, y in chunk])).sum())
    model.train()
    return correct / len(pairs)


def train_classifier(tokenizer, args: argparse.Namespace, max_len: int = 64) -> tuple[object, dict]:
    """Train the positive/negative review classifier on a fresh draw of the corpus.

    :param tokenizer: the tokenizer
    :param args: build options
    :param max_len: truncation length
    :return: ``(model, stats)``
    """
    from transformers import GPT2ForSequenceClassification

    pairs = corpus.labelled_reviews(30000, seed=args.seed + 1)
    n_test = len(pairs) // 10
    train, test = pairs[:-n_test], pairs[-n_test:]
    print(f"[clf] labelled reviews: train {len(train)}, held-out {len(test)}", flush=True)
    torch.manual_seed(args.seed + 1)
    model = GPT2ForSequenceClassification(classifier_config(tokenizer, max_len))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + 1)
    t0 = time.time()
    model.train()
    for step in range(args.clf_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.clf_steps, 2e-3, max(1, args.clf_steps // 20))
        idx = torch.randint(len(train), (64,), generator=gen).tolist()
        batch = encode_batch(tokenizer, [train[i][0] for i in idx], max_len)
        labels = torch.tensor([train[i][1] for i in idx])
        loss = model(**batch, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0 or step + 1 == args.clf_steps:
            print(
                f"[clf] step {step + 1}/{args.clf_steps} loss {loss.item():.4f}",
                flush=True,
            )
    acc = classifier_accuracy(model, tokenizer, test, max_len)
    print(f"[clf] held-out accuracy {acc:.4f}", flush=True)
    stats = {
        "train_examples": len(train),
        "heldout_examples": len(test),
        "heldout_accuracy": round(acc, 4),
        "seconds": round(time.time() - t0, 1),
    }
    return model, stats


# --------------------------------------------------------------------------------------------
# Manifest and main
# --------------------------------------------------------------------------------------------


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy the saved tokenizer files next to a model, byte for byte.

    Copying (rather than ``save_pretrained`` again) keeps out the padding/truncation state that
    batch encoding leaves on a fast tokenizer's backend.

    :param src: the folder written by ``tokenizer.save_pretrained``
    :param dst: the model folder
    """
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copyfile(f, dst / f.name)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file.

    :param path: the file
    :return: the hex digest
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sample_continuations(model, tokenizer, prompts: Sequence[str], max_new_tokens: int = 32) -> list[str]:
    """Greedy continuations, for the build log.

    :param model: the causal LM
    :param tokenizer: the tokenizer
    :param prompts: prompts
    :param max_new_tokens: generation budget
    :return: the decoded continuations
    """
    model.eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")
            gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
            out.append(tokenizer.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def rebuild_command(args: argparse.Namespace) -> str:
    """The command line that rebuilds the assets with ``args`` (written to the manifest).

    :param args: the parsed arguments
    :return: the command
    """
    return " ".join(
        [
            BUILD_COMMAND,
            "--seed",
            str(args.seed),
            "--steps",
            str(args.steps),
            "--threads",
            str(args.threads),
        ]
        + [
            f"--{k.replace('_', '-')} {getattr(args, k)}"
            for k in ("clf_steps", "docs", "vocab_size", "batch_size", "seq_len", "lr")
        ]
    )


def library_versions() -> dict[str, str]:
    """Versions of Python and of the libraries the build ran on (written to the manifest).

    :return: name -> version
    """
    import tokenizers
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """Build every asset and write ``MANIFEST.json``.

    :param argv: command-line arguments
    :return: the manifest
    """
    args = parse_args(argv)
    t_start = time.time()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    texts = corpus.generate_corpus(args.docs, seed=args.seed)
    n_bytes = sum(len(t.encode()) + 1 for t in texts)
    print(f"[corpus] {len(texts)} documents, {n_bytes / 1e6:.2f} MB", flush=True)

    tokenizer = train_tokenizer(texts, args.vocab_size, args.seq_len)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    print(
        f"[tokenizer] len {len(tokenizer)}, eos {tokenizer.eos_token_id}, pad {tokenizer.pad_token_id}",
        flush=True,
    )

    lm, lm_stats = train_lm(tokenizer, texts, args)
    save_lm(lm, tokenizer, out / "lm")
    copy_tokenizer_files(out / "tokenizer", out / "lm")
    prompts = list(corpus.REVIEW_OPENERS[:5]) + [
        "12+7=",
        "8*3=",
        "Numbers: 3",
        "Concepts: actor, story, love. Sentence:",
        "Keywords: music, ending. Review:",
    ]
    samples = sample_continuations(lm, tokenizer, prompts)
    for p, s in zip(prompts, samples):
        print(f"[sample] {p!r} -> {s!r}", flush=True)

    clf, clf_stats = train_classifier(tokenizer, args)
    clf.save_pretrained(str(out / "classifier"), safe_serialization=True)
    copy_tokenizer_files(out / "tokenizer", out / "classifier")

    files = [
        "tokenizer/tokenizer.json",
        "lm/model.safetensors",
        "classifier/model.safetensors",
    ]
    manifest = {
        "command": rebuild_command(args),
        "seed": args.seed,
        "steps": args.steps,
        "threads": args.threads,
        "corpus": {
            "documents": len(texts),
            "bytes": n_bytes,
            "mix": dict(corpus.DOCUMENT_MIX),
        },
        "tokenizer": {
            "len": len(tokenizer),
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "lm": lm_stats,
        "lm_final_loss": lm_stats["final_train_loss"],
        "classifier": clf_stats,
        "classifier_accuracy": clf_stats["heldout_accuracy"],
        "sha256": {f: sha256_file(out / f) for f in files},
        "samples": dict(zip(prompts, samples)),
        "versions": library_versions(),
        "build_seconds": round(time.time() - t_start, 1),
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[done] {out} in {manifest['build_seconds']}s", flush=True)
    return manifest


if __name__ == "__main__":
    main()
