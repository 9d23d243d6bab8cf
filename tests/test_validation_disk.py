"""Nothing completed is lost on disk: atomic writes (``model.save``, reports, warm-start's folder), one command per
``--out`` (a lock), ``--resume`` that never drops completed runs, and the truth after a double Ctrl-C.

A full disk is simulated two ways: a real 64 KiB tmpfs where the test may mount one (root on Linux), and everywhere
a write that fails with ``ENOSPC`` part way.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sb3_grpo.cli import main
from sb3_grpo.compare import runner as compare_mod
from sb3_grpo.compare.config import CompareError, make_config
from sb3_grpo.compare.report import write_report
from sb3_grpo.compare.results import new_results, prepare_out_dir
from sb3_grpo.file_io import LOCK_FILE, FolderBusyError, FolderLock, atomic_folder, to_jsonable, write_json_atomic

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETS = ["--set", "*.n_steps=64", "--set", "*.batch_size=32", "--set", "*.n_epochs=1"]


def _cartpole_args(out: Path, algos: str, seeds: int, *extra: str) -> list[str]:
    return [
        "compare",
        "--env",
        "CartPole-v1",
        "--algos",
        algos,
        "--seeds",
        str(seeds),
        "--timesteps",
        "128",
        "--eval-episodes",
        "2",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(out),
        *SETS,
        *extra,
    ]


def _config(algos, seeds):
    return make_config(
        "CartPole-v1",
        algos,
        seeds=seeds,
        timesteps=128,
        eval_episodes=2,
        device="cpu",
        overrides={"*": {"n_steps": 64, "batch_size": 32, "n_epochs": 1}},
    )


def _completed_out_dir(out: Path, algos, seeds) -> dict:
    """An out dir as a finished ``compare`` leaves it (hand-made runs: no training)."""
    cfg = _config(algos, seeds)
    results = new_results(cfg, "sb3-grpo compare ...")
    for algo, seed in compare_mod.planned_runs(cfg):
        results["runs"][cfg.run_key(algo, seed)] = {
            "algo": algo,
            "seed": seed,
            "status": "complete",
            "fingerprint": to_jsonable(cfg.fingerprint(algo)),
            "curve": {"steps": [64, 128], "reward": [10.0 + seed, 20.0 + seed], "episodes": [3, 3]},
            "final": {"reward_mean": 20.0 + seed, "reward_std": 1.0, "episodes": 2, "deterministic": True},
            "env_steps": 128,
            "wall_time_s": 1.0,
            "steps_per_s": 128.0,
            "step_unit": "steps",
            "peak_rss_mb": 100.0,
            "peak_rss_per_run": True,
            "cuda_peak_mb": None,
            "kl_to_init": 0.01,
            "kl_ref": None,
        }
    results["status"] = "complete"
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", results)
    return results


# ------------------------------------------------------------------------------------------------------------
# --resume never drops completed runs
# ------------------------------------------------------------------------------------------------------------


def test_resume_with_fewer_algos_or_seeds_is_refused_and_keeps_every_run(tmp_path, capsys):
    out = tmp_path / "k"
    before = _completed_out_dir(out, ["ppo", "grpo"], 3)
    with pytest.raises(SystemExit) as exc:
        main(_cartpole_args(out, "ppo", 2, "--resume"))
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "--resume" in err and "grpo/seed0" in err and "would be dropped" in err
    assert "--algos grpo,ppo --seeds 3" in err  # what to pass to keep them
    after = json.loads((out / "results.json").read_text())
    assert set(after["runs"]) == set(before["runs"]) and len(after["runs"]) == 6
    assert not (out / LOCK_FILE).exists()  # the lock is released on refusal


def test_run_compare_resume_refuses_a_plan_that_drops_runs(tmp_path):
    out = tmp_path / "k"
    _completed_out_dir(out, ["ppo", "grpo"], 2)
    with pytest.raises(CompareError, match=r"ppo/seed1.*would be dropped"):
        compare_mod.run_compare(_config(["ppo", "grpo"], 1), out, "cmd", resume=True, progress=False, log=lambda m: 0)
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 4


# ------------------------------------------------------------------------------------------------------------
# One command per --out
# ------------------------------------------------------------------------------------------------------------


def test_a_second_compare_on_a_locked_out_dir_is_refused(tmp_path, capsys):
    out = tmp_path / "k"
    _completed_out_dir(out, ["ppo"], 1)
    with FolderLock(out, what="--out"):  # another compare holds it
        for mode in ("--resume", "--overwrite"):
            with pytest.raises(SystemExit) as exc:
                main(_cartpole_args(out, "ppo", 1, mode))
            err = capsys.readouterr().err
            assert exc.value.code == 2 and f"--out {out} is in use" in err and f"pid {os.getpid()}" in err
            assert "choose another --out" in err
        assert len(json.loads((out / "results.json").read_text())["runs"]) == 1  # --overwrite removed nothing


def test_folder_lock_refuses_a_second_holder_and_frees_on_release_or_death(tmp_path):
    lock = FolderLock(tmp_path, what="--out").acquire()
    with pytest.raises(FolderBusyError, match=str(os.getpid())):
        FolderLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    FolderLock(tmp_path).acquire().release()
    # a holder that dies (killed, no release) leaves a free lock: the kernel drops flock locks with the process
    code = f"from sb3_grpo.file_io import FolderLock; FolderLock({str(tmp_path)!r}).acquire(); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    FolderLock(tmp_path).acquire().release()


# ------------------------------------------------------------------------------------------------------------
# Full disk: the previous file stays, no 0-byte or half file
# ------------------------------------------------------------------------------------------------------------


class _FullDisk:
    """``open`` whose files for ``marker`` take ``budget`` bytes, then fail with ENOSPC (a disk that fills up)."""

    def __init__(self, monkeypatch, marker: str, budget: int = 16) -> None:
        self.marker, self.budget, self.real = marker, budget, builtins.open
        monkeypatch.setattr(builtins, "open", self)
        monkeypatch.setattr(io, "open", self)

    def __call__(self, file, mode="r", *args, **kwargs):
        f = self.real(file, mode, *args, **kwargs)
        if self.marker in os.fspath(file) and any(c in mode for c in "wax"):
            budget = [self.budget]
            real_write = f.write

            def write(data):
                if len(data) > budget[0]:
                    real_write(data[: budget[0]])
                    f.flush()
                    raise OSError(errno.ENOSPC, "No space left on device")
                budget[0] -= len(data)
                return real_write(data)

            f.write = write
        return f


def test_report_on_a_full_disk_keeps_the_previous_report(tmp_path, monkeypatch):
    results = _completed_out_dir(tmp_path, ["ppo"], 1)
    (tmp_path / "report.md").write_text("the previous report\n")
    _FullDisk(monkeypatch, "report.md")
    with pytest.raises(OSError, match=r"report\.md.*No space left.*free some space"):
        write_report(results, tmp_path)
    assert (tmp_path / "report.md").read_text() == "the previous report\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_report_command_on_a_full_disk_says_so_without_a_traceback(tmp_path, monkeypatch, capsys):
    _completed_out_dir(tmp_path, ["ppo"], 1)
    _FullDisk(monkeypatch, "report.md")
    assert main(["report", str(tmp_path)]) == 1
    assert "error: could not write" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()  # no 0-byte report


def _mount_tmpfs(folder: Path, size: str = "64k") -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _fill(folder: Path) -> None:
    """Write ``folder/filler`` until the disk is full."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_report_on_a_real_full_tmpfs_leaves_no_empty_files(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk):
        pytest.skip("cannot mount a small tmpfs here (needs root on Linux); the ENOSPC tests above cover it")
    try:
        results = _completed_out_dir(disk, ["ppo"], 1)
        _fill(disk)
        with pytest.raises(OSError, match="No space left"):
            write_report(results, disk)
        for name in ("report.md", "curves.png"):
            assert not (disk / name).exists(), f"a torn {name} was left on the full disk"
        assert not [p.name for p in disk.iterdir() if p.name.endswith(".tmp")]
        assert json.loads((disk / "results.json").read_text())["runs"]  # the completed runs are untouched
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def _tiny_model():
    from sb3_grpo import GRPO

    return GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")


def test_a_failing_save_keeps_the_previous_model(tmp_path, monkeypatch):
    import stable_baselines3.common.base_class as base_class

    from sb3_grpo import GRPO

    model = _tiny_model()
    path = tmp_path / "model.zip"
    model.save(path)
    good = path.read_bytes()

    def torn(save_path, *args, **kwargs):  # SB3's writer dies half way (a full disk)
        with open(save_path, "wb") as f:
            f.write(b"PK\x03\x04 half a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(base_class, "save_to_zip_file", torn)
    with pytest.raises(OSError, match=r"model\.zip.*No space left"):
        model.save(path)
    assert path.read_bytes() == good
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    GRPO.load(path, device="cpu")  # still a complete model


def test_save_keeps_sb3s_naming_and_refuses_an_empty_path(tmp_path):
    model = _tiny_model()
    model.save(tmp_path / "no_suffix")
    assert (tmp_path / "no_suffix.zip").is_file()  # SB3 appends .zip
    buffer = io.BytesIO()
    model.save(buffer)  # a file object still works
    assert buffer.getvalue()[:2] == b"PK"
    for bad in ("", str(tmp_path)):
        with pytest.raises(ValueError, match=r"save: path .* give a file path"):
            model.save(bad)


def test_save_on_a_real_full_tmpfs_keeps_the_previous_model(tmp_path):
    disk = tmp_path / "disk"
    model = _tiny_model()
    model.save(tmp_path / "probe.zip")
    size = (tmp_path / "probe.zip").stat().st_size
    if not _mount_tmpfs(disk, size=str(size * 3 // 2)):
        pytest.skip("cannot mount a small tmpfs here (needs root on Linux); the ENOSPC test above covers it")
    try:
        model.save(disk / "model.zip")
        good = (disk / "model.zip").read_bytes()
        with pytest.raises(OSError, match="model.zip"):
            model.save(disk / "model.zip")  # a second copy does not fit beside the first
        assert (disk / "model.zip").read_bytes() == good
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ------------------------------------------------------------------------------------------------------------
# warm-start: a whole folder or none; an existing --out needs --overwrite
# ------------------------------------------------------------------------------------------------------------


def test_atomic_folder_leaves_nothing_or_the_old_folder_on_failure(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(OSError), atomic_folder(target) as tmp:
        (tmp / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_folder(target) as tmp:
        (tmp / "weights").write_text("good")
    with pytest.raises(FileExistsError, match="overwrite"), atomic_folder(target):
        pass
    with pytest.raises(KeyboardInterrupt), atomic_folder(target, overwrite=True) as tmp:
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt
    assert [p.name for p in target.iterdir()] == ["weights"] and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_warm_start_refuses_an_existing_out_or_a_file(tmp_path, capsys):
    out = tmp_path / "warm"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit) as exc:
        main(["warm-start", "--env", "Arithmetic-v0", "--steps", "1", "--out", str(out)])
    assert exc.value.code == 2 and "already exists; pass --overwrite" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["warm-start", "--env", "Arithmetic-v0", "--steps", "1", "--out", str(a_file)])
    assert exc.value.code == 2 and "is a file; give a folder path" in capsys.readouterr().err


def test_warm_start_that_fails_to_save_leaves_no_half_folder(tmp_path, monkeypatch, capsys):
    from transformers import PreTrainedModel

    def full_disk(self, folder, *args, **kwargs):
        Path(folder, "config.json").write_text("{}")  # the config fits, the weights do not
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    out = tmp_path / "warm"
    argv = ["warm-start", "--env", "Arithmetic-v0", "--steps", "1", "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 1
    assert "No space left" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling


def test_warm_start_rejects_a_non_text_env_clearly(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["warm-start", "--env", "CartPole-v1", "--steps", "1", "--out", str(tmp_path / "w")])
    assert exc.value.code == 2 and "is not a text env" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------------------------------------------------
# Ctrl-C twice: the message tells the truth about report.md
# ------------------------------------------------------------------------------------------------------------


def test_double_ctrl_c_says_report_md_was_not_written(tmp_path, monkeypatch, capsys):
    import sb3_grpo.compare.report as report_mod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_mod, "run_one", interrupted)
    monkeypatch.setattr(compare_mod, "evaluate_untrained", lambda cfg: {"reward_mean": 0.0, "episodes": 1})
    monkeypatch.setattr(report_mod, "write_report", interrupted)  # the second Ctrl-C lands while it writes
    out = tmp_path / "k"
    assert main(_cartpole_args(out, "ppo", 1)) == 130
    err = capsys.readouterr().err
    assert "report.md was not written" in err and "marks the missing ones" not in err
    assert f"sb3-grpo report {out}" in err
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"


def test_prepare_out_dir_ignores_a_stale_lock_file(tmp_path):
    out = tmp_path / "k"
    out.mkdir()
    (out / LOCK_FILE).write_text("12345\n")  # left by a killed command
    assert prepare_out_dir(out, overwrite=False, resume=False, lock=FolderLock(out)) == []
