"""A checkpoint never runs code on load: the restricted unpickler for SB3 zips, the safetensors + JSON format, and a
crafted checkpoint through every documented load path (the library, the CLI, the elastic resume)."""

from __future__ import annotations

import base64
import json
import pickle
import re
import zipfile
from collections import deque
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import LinearSchedule

from sb3_grpo import GRPO, DrGRPO
from sb3_grpo.callbacks import ElasticCheckpointCallback
from sb3_grpo.cli import main

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    """Unpickling it creates the file ``marker`` (what a crafted checkpoint would do with any command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _quiet(model):
    model.set_logger(configure(None, []))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small trained GRPO model and its SB3 zip."""
    folder = tmp_path_factory.mktemp("safe")
    model = _quiet(GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=2, seed=3, device="cpu"))
    model.learn(64)
    model.save(folder / "model.zip")
    return model, folder / "model.zip"


def crafted(source: Path, target: Path, entry: str, marker: Path) -> Path:
    """A copy of the zip ``source`` whose pickled ``entry`` creates ``marker`` when unpickled."""
    with zipfile.ZipFile(source) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    data = json.loads(files["data"])
    data[entry] = {
        ":type:": "<class 'object'>",
        ":serialized:": base64.b64encode(pickle.dumps(_Payload(marker))).decode(),
    }
    files["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(target, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return target


def test_the_crafted_file_is_live_when_trusted(saved, tmp_path):
    """The payload does run when the user opts in: the refusals below are the allow-list's doing."""
    marker = tmp_path / "marker"
    path = crafted(saved[1], tmp_path / "evil.zip", "observation_space", marker)
    with pytest.raises(Exception):  # noqa: B017,PT011  (the payload is no space: SB3 fails after running it)
        GRPO.load(path, trusted=True)
    assert marker.exists()


@pytest.mark.parametrize("entry", ["observation_space", "clip_range", "policy_class", "_explore_rng"])
def test_a_crafted_zip_runs_no_code_through_load(saved, tmp_path, entry):
    from sb3_grpo.common.checkpoints.safe_loading import load_model

    marker = tmp_path / "marker"
    path = crafted(saved[1], tmp_path / "evil.zip", entry, marker)
    for load in (lambda: GRPO.load(path), lambda: DrGRPO.load(path), lambda: load_model(PPO, path)):
        with pytest.raises(ValueError, match=rf"entry '{entry}'.*io\.open.*trusted=True"):
            load()
        assert not marker.exists()


def test_a_crafted_statistics_entry_is_skipped_and_the_model_loads(saved, tmp_path):
    marker = tmp_path / "marker"
    path = crafted(saved[1], tmp_path / "evil.zip", "ep_info_buffer", marker)
    with pytest.warns(UserWarning, match="skipped the entries ep_info_buffer"):
        model = GRPO.load(path)
    assert not marker.exists() and model.ep_info_buffer is None
    obs = np.zeros((3, 4), dtype=np.float32)
    assert np.array_equal(model.predict(obs, deterministic=True)[0], saved[0].predict(obs, deterministic=True)[0])
    model.set_env(saved[0].env)
    model.learn(32, reset_num_timesteps=False)  # SB3 rebuilds the statistics


def test_a_crafted_zip_runs_no_code_through_the_cli(saved, tmp_path, capsys):
    marker = tmp_path / "marker"
    path = crafted(saved[1], tmp_path / "evil.zip", "observation_space", marker)
    with pytest.raises(SystemExit) as exit_:
        main(["sample", str(path), "--env", "CartPole-v1", "--n", "1"])
    assert exit_.value.code == 2 and not marker.exists()
    assert "--trust-checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["human-eval", "export", str(path), str(saved[1]), "--env", "CartPole-v1", "--out", str(tmp_path / "he")])
    assert exit_.value.code == 2 and not marker.exists()
    assert "observation_space" in capsys.readouterr().err


def test_a_crafted_checkpoint_runs_no_code_on_the_elastic_resume(saved, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    marker = tmp_path / "marker"
    crafted(saved[1], folder / "rl_model_64_steps.zip", "_explore_rng", marker)  # an entry the resume reads
    model = _quiet(GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=3, device="cpu"))
    callback = ElasticCheckpointCallback(save_freq=1, save_path=folder, other_run="resume")
    with pytest.raises(ValueError, match="_explore_rng"):
        model.learn(96, callback=callback)
    assert not marker.exists()
    # an entry the resume does not need is never read at all
    crafted(saved[1], folder / "rl_model_64_steps.zip", "clip_range", marker)
    model = _quiet(GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=3, device="cpu"))
    callback = ElasticCheckpointCallback(save_freq=1, save_path=folder, other_run="resume")
    model.learn(96, callback=callback)
    assert not marker.exists() and callback.resumed_from is not None and model.num_timesteps == 96


def test_the_allow_list_decodes_what_sb3_pickled(tmp_path):
    """Every pickled entry of checkpoints with spaces of each kind, schedules, classes in policy_kwargs and a buffer
    class decodes to what cloudpickle itself gives (compared through their pickles)."""
    from stable_baselines3.common.buffers import RolloutBuffer
    from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete

    from sb3_grpo.common.checkpoints.unpickling import safe_custom_objects

    models = [
        PPO(
            "MlpPolicy",
            "Pendulum-v1",
            n_steps=32,
            batch_size=32,
            learning_rate=LinearSchedule(1e-3, 1e-4, 0.5),
            rollout_buffer_class=RolloutBuffer,
            policy_kwargs={"activation_fn": th.nn.ReLU, "optimizer_class": th.optim.AdamW},
        ),  # fmt: skip
        PPO("MlpPolicy", IdentityEnvMultiDiscrete(2), n_steps=32, batch_size=32, clip_range_vf=0.3),
        GRPO("MlpPolicy", IdentityEnvMultiBinary(2), n_steps=32, batch_size=32),
    ]
    for i, model in enumerate(models):
        _quiet(model).learn(32)
        path = tmp_path / f"m{i}.zip"
        model.save(path)
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
        decoded = safe_custom_objects(path)
        pickled = {k for k, v in data.items() if isinstance(v, dict) and ":serialized:" in v}
        assert set(decoded) == pickled and {"observation_space", "action_space", "policy_class"} <= pickled
        for key in pickled:
            reference = pickle.loads(base64.b64decode(data[key][":serialized:"]))  # the trusted way, as SB3 does
            if key == "lr_schedule":
                assert decoded[key] is None  # never read: SB3 makes it again from learning_rate
            elif key == "_explore_rng":
                assert decoded[key].bit_generator.state == reference.bit_generator.state
            elif isinstance(reference, np.ndarray):
                assert np.array_equal(decoded[key], reference)
            elif callable(reference) and not isinstance(reference, type):
                assert [decoded[key](p) for p in (1.0, 0.6, 0.0)] == [reference(p) for p in (1.0, 0.6, 0.0)]
            else:
                assert decoded[key] == reference, key


def test_a_schedule_made_of_code_is_refused_unless_replaced_or_trusted(tmp_path):
    path = tmp_path / "lambda.zip"
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=lambda p: 1e-3 * p)
    model.save(path)
    with pytest.raises(ValueError, match=r"entry 'learning_rate' is a pickle that names cloudpickle"):
        GRPO.load(path)
    loaded = GRPO.load(path, custom_objects={"learning_rate": 5e-4})  # SB3's way out: replace the entry
    assert loaded.learning_rate == 5e-4 and loaded.lr_schedule(0.3) == 5e-4
    trusted = GRPO.load(path, trusted=True)  # or trust the file: SB3 unpickles the function
    assert trusted.learning_rate(0.5) == pytest.approx(5e-4)


def test_the_unpickler_refuses_code_and_calls_of_reference_only_classes():
    from stable_baselines3.common.policies import ActorCriticPolicy

    from sb3_grpo.common.checkpoints.unpickling import restricted_loads

    class Build:
        def __reduce__(self):
            return (ActorCriticPolicy, ())

    assert restricted_loads(pickle.dumps(ActorCriticPolicy)) is ActorCriticPolicy  # a reference: fine
    assert restricted_loads(pickle.dumps(deque([{"r": 1.0}], maxlen=3))) == deque([{"r": 1.0}], maxlen=3)
    import cloudpickle

    for payload in (Build(), _Payload(Path("never")), np.load, print, lambda x: x):
        with pytest.raises(pickle.UnpicklingError):
            restricted_loads(cloudpickle.dumps(payload))
    assert not Path("never").exists()


def _same(a, b) -> bool:
    if isinstance(a, np.random.Generator):
        return a.bit_generator.state == b.bit_generator.state
    if isinstance(a, np.ndarray) or isinstance(a, dict) and any(isinstance(v, np.ndarray) for v in a.values()):
        return all(np.array_equal(a[k], b[k]) for k in a) if isinstance(a, dict) else np.array_equal(a, b)
    if callable(a) and not isinstance(a, type):
        return [a(p) for p in (1.0, 0.5, 0.0)] == [b(p) for p in (1.0, 0.5, 0.0)]
    return a == b


@pytest.mark.parametrize("algo", [GRPO, PPO])
def test_the_safetensors_format_loads_what_the_zip_loads_without_pickle(tmp_path, algo):
    from sb3_grpo.common.checkpoints.safe_loading import load_model

    model = _quiet(algo("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=2, seed=1, device="cpu"))
    model.learn(64)
    model.save(tmp_path / "m.zip")
    if algo is GRPO:
        model.save(tmp_path / "m.safetensors")
    else:
        from sb3_grpo.common.checkpoints.files import atomic_save

        atomic_save(model, tmp_path / "m.safetensors")
    with zipfile.ZipFile(tmp_path / "m.zip") as archive:
        keys = set(json.loads(archive.read("data")))
    reference = algo.load(tmp_path / "m.zip") if algo is GRPO else PPO.load(tmp_path / "m.zip")

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    with (
        mock.patch("pickle.loads", refuse),
        mock.patch("pickle.load", refuse),
        mock.patch("pickle.Unpickler", refuse),
        mock.patch("pickle._Unpickler", refuse),
        mock.patch("cloudpickle.loads", refuse),
    ):
        loaded = load_model(algo, tmp_path / "m.safetensors", device="cpu")
    assert type(loaded) is algo
    for key in keys - {"start_time"}:
        assert _same(getattr(loaded, key), getattr(reference, key)), key
    for name in ("policy", "policy.optimizer"):
        ours, theirs = loaded.get_parameters()[name], reference.get_parameters()[name]
        flat = [(k, v) for k, v in ours.items()]
        assert json.dumps(str(flat)) == json.dumps(str(list(theirs.items())))  # same structure and values
    for ours, theirs in zip(loaded.policy.parameters(), reference.policy.parameters()):
        assert th.equal(ours, theirs)


def test_the_safetensors_format_keeps_a_text_model_and_its_tied_weights(tmp_path):
    from textrl_envs.sb3 import make_vec_env

    env = make_vec_env("TextGen-v0", n_envs=2, seed=0, device="cpu", max_new_tokens=3)
    model = _quiet(GRPO("CausalLMPolicy", env, n_steps=6, batch_size=12, n_epochs=1, seed=0, device="cpu"))
    model.learn(12)
    model.save(tmp_path / "lm.safetensors")
    loaded = GRPO.load(tmp_path / "lm.safetensors", env=env, device="cpu")
    for (name, ours), theirs in zip(model.policy.state_dict().items(), loaded.policy.state_dict().values()):
        assert th.equal(ours, theirs), name
    assert isinstance(loaded.observation_space, spaces.Dict) and loaded.observation_space == model.observation_space
    lm = loaded.policy.lm
    if lm.config.tie_word_embeddings:
        assert lm.get_output_embeddings().weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()


def test_a_schedule_made_of_code_is_refused_by_the_safetensors_format(tmp_path):
    model = GRPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, learning_rate=lambda p: 1e-3 * p)
    with pytest.raises(ValueError, match=r"learning_rate is a builtins.function.*LinearSchedule"):
        model.save(tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_a_crafted_safetensors_file_names_no_code(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    saved[0].save(tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        metadata = f.metadata()
    data = json.loads(metadata["data"])
    data["policy_class"] = {":class:": "builtins:open"}
    save_file(load_file(tmp_path / "m.safetensors"), tmp_path / "evil.safetensors",
              metadata={**metadata, "data": json.dumps(data)})  # fmt: skip
    with pytest.raises(ValueError, match="builtins.open"):
        GRPO.load(tmp_path / "evil.safetensors")
    with pytest.raises(ValueError, match="not a saved model"):
        save_file({"x": th.zeros(2)}, tmp_path / "plain.safetensors")
        GRPO.load(tmp_path / "plain.safetensors")


def test_every_torch_load_reads_weights_only():
    """No ``torch.load`` in the package, the lab, the examples or the tests unpickles arbitrary objects."""
    calls = []
    for folder in ("sb3_grpo", "textrl_envs", "benchmarks", "examples", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for match in re.finditer(r"\b(?:th|torch)\.load\(", text):
                end = text.find("\n\n", match.end())
                call = text[match.start() : end if end > 0 else None]
                depth, stop = 0, 0
                for i, ch in enumerate(call):
                    depth += (ch == "(") - (ch == ")")
                    if depth == 0 and ch == ")":
                        stop = i
                        break
                calls.append((path.relative_to(ROOT), call[: stop + 1]))
    assert calls  # the scan sees the calls there are
    unsafe = [f"{p}: {c}" for p, c in calls if "weights_only=True" not in c]
    assert unsafe == []
