"""``human-eval report``: Krippendorff's alpha per dimension, raters who miss the calibration items, and the scores
(or win rates) per run with intervals."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sb3_grpo.human_eval.protocol import (
    ALPHA_MIN,
    CALIBRATION,
    DIMENSIONS,
    KEY_FILE,
    SIDE_BY_SIDE,
    SIDES,
    load_preferences,
    load_ratings,
    load_sample_scores,
)

__all__ = ["krippendorff_alpha", "preference_outcomes", "report"]


def krippendorff_alpha(matrix: np.ndarray, level: str = "interval") -> float:
    """Krippendorff's alpha of a raters x items matrix (NaN: not rated), by the ``krippendorff`` package; NaN when
    fewer than two ratings of one item exist."""
    try:
        import krippendorff
    except ImportError:
        raise ImportError(
            "the human-eval report needs krippendorff; pip install 'textrl[human-eval]' (or pip install krippendorff)"
        ) from None
    pairable = np.sum(~np.isnan(matrix), axis=0) >= 2
    if not pairable.any() or len(np.unique(matrix[:, pairable][~np.isnan(matrix[:, pairable])])) < 2:
        return float("nan")  # no pair of ratings, or no variation at all: alpha is undefined
    return float(krippendorff.alpha(reliability_data=matrix, level_of_measurement=level))


def _interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and a 95% t-interval."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def _summary(per_item: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "low", "high", "items"}`` of the per-item mean scores (a 95% t-interval)."""
    mean, low, high = _interval(per_item) if per_item else (float("nan"),) * 3
    return {"mean": mean, "low": low, "high": high, "items": len(per_item)}


def _calibration_summary(checks: Mapping[str, Sequence[tuple[str, bool]]], max_miss_rate: float) -> dict[str, Any]:
    """Per rater, from their ``(kind, missed)`` checks against the known answers: ``scored``, ``missed``, ``flagged``
    (none checked, or more than ``max_miss_rate`` of them missed) and, per kind, ``[checked, missed]``."""
    out = {}
    for rater, given in checks.items():
        missed = sum(m for _, m in given)
        kinds = {kind: [sum(k == kind for k, _ in given), sum(m for k, m in given if k == kind)]
                 for kind in sorted({k for k, _ in given})}  # fmt: skip
        flagged = not given or missed / len(given) > max_miss_rate
        out[rater] = {"scored": len(given), "missed": missed, "flagged": flagged, "by_kind": kinds}
    return out


def report(folder: str | os.PathLike, level: str = "interval", tolerance: int = 1, max_miss_rate: float = 0.2) -> dict:
    """Reliability and scores of a rated folder; also written to ``report.json`` and ``report.md`` there.

    A side-by-side folder (:func:`export_pairs`) gets, from :func:`preference_outcomes`: ``alpha`` of the un-blinded
    choices, ``unreliable``, and ``win_rate`` (per run and dimension: the share of items the run won among the items
    not tied, with a 95% Wilson interval; ``wins``, ``losses``, ``ties``, ``items``); from the 1-5 scores of the two
    completions (when any were given): ``score_alpha`` (per dimension, over the completions of the run items),
    ``unreliable_scores`` and ``scores`` (per run, as below); and ``calibration`` over the calibration pairs (a
    choice is missed when it is not the known one, a score as below).

    :param level: Krippendorff's level of measurement (``"interval"``, or ``"ordinal"`` for ranks only).
    :param tolerance: A calibration score is missed when it is more than this far from the known one.
    :param max_miss_rate: A rater who misses more than this fraction of their calibration answers is flagged.
    :return: ``alpha`` (per dimension), ``unreliable`` (dimensions with alpha < :data:`ALPHA_MIN`),
        ``calibration`` (per rater: scored, missed, flagged; empty without calibration items), ``scores`` (per
        source and dimension: mean over items of the raters' mean, with a 95% t-interval, and the number of items).
    """
    folder = Path(folder)
    key = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
    if "models" in key:
        return _report_pairs(folder, key, level, tolerance, max_miss_rate)
    return _report_scores(folder, key, level, tolerance, max_miss_rate)


def _write_report(folder: Path, result: dict[str, Any]) -> dict[str, Any]:
    (folder / "report.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    (folder / "report.md").write_text(_markdown(result), encoding="utf-8")
    return result


def _calibration_checks(
    key: Mapping[str, Any], ratings: Mapping[tuple[str, str], Mapping[str, int]], raters: Sequence[str], tolerance: int
) -> dict[str, list[tuple[str, bool]]]:
    """Per rater, ``("score", missed)`` for every score they gave that a calibration item knows (none without
    calibration items)."""
    known = {i: k["scores"] for i, k in key.items() if k["source"] == CALIBRATION}
    if not known:
        return {}
    checks: dict[str, list[tuple[str, bool]]] = {r: [] for r in raters}
    for rater in raters:
        for item, want in known.items():
            given = ratings.get((rater, item), {})
            checks[rater] += [("score", abs(given[d] - s) > tolerance) for d, s in want.items() if d in given]
    return checks


def _report_scores(folder: Path, key: dict[str, Any], level: str, tolerance: int, max_miss_rate: float) -> dict:
    """:func:`report` of a folder of 1-5 scores."""
    ratings = load_ratings(folder)
    raters = sorted({r for r, _ in ratings})
    items = sorted(i for i, k in key.items() if k["source"] != CALIBRATION)
    alpha = {}
    for dim in DIMENSIONS:
        matrix = np.array([[ratings.get((r, i), {}).get(dim, np.nan) for i in items] for r in raters], dtype=float)
        alpha[dim] = krippendorff_alpha(matrix.reshape(len(raters), len(items)), level) if raters else float("nan")
    checks = _calibration_checks(key, ratings, raters, tolerance)
    scores: dict[str, dict[str, Any]] = {}
    for source in sorted({k["source"] for k in key.values()} - {CALIBRATION}):
        scores[source] = {}
        for dim in DIMENSIONS:
            per_item = []
            for item, k in key.items():
                given = [ratings[(r, item)][dim] for r in raters if dim in ratings.get((r, item), {})]
                if k["source"] == source and given:
                    per_item.append(float(np.mean(given)))
            scores[source][dim] = _summary(per_item)
    unreliable = [d for d, a in alpha.items() if not (a >= ALPHA_MIN)]
    result = {"raters": raters, "alpha": alpha, "alpha_min": ALPHA_MIN, "unreliable": unreliable,
              "calibration": _calibration_summary(checks, max_miss_rate), "scores": scores}  # fmt: skip
    return _write_report(folder, result)


def preference_outcomes(
    key: Mapping[str, Any], preferences: Mapping[tuple[str, str], Mapping[str, str]], dim: str
) -> dict[str, dict[str, float]]:
    """Un-blind the choices on one dimension: ``item -> {rater: outcome}`` with the outcome for the first run of
    ``key["models"]``: 1 when the rater preferred it, 0 when they preferred the other, 0.5 for a tie (the items that
    pair the two runs only: calibration pairs are left out)."""
    first = key["models"][0]
    out: dict[str, dict[str, float]] = {}
    for (rater, item), given in preferences.items():
        choice = given.get(dim)
        if choice is None or item not in key or key[item].get("source") != SIDE_BY_SIDE:
            continue
        out.setdefault(item, {})[rater] = 0.5 if choice == "tie" else float(key[item][choice] == first)
    return out


def _win_rates(outcomes: Mapping[str, Mapping[str, float]], models: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each run's win rate on one dimension from :func:`preference_outcomes`, with a 95% Wilson interval."""
    from sb3_grpo.compare.stats import wilson_interval

    per_item = [float(np.mean(list(v.values()))) for v in outcomes.values() if v]
    wins = sum(u > 0.5 for u in per_item)
    losses = sum(u < 0.5 for u in per_item)
    out = {}
    for model, k in ((models[0], wins), (models[1], losses)):
        low, high = wilson_interval(k, wins + losses)
        out[model] = {"rate": k / (wins + losses) if wins + losses else float("nan"), "low": low, "high": high,
                      "wins": k, "losses": wins + losses - k, "ties": len(per_item) - wins - losses,
                      "items": len(per_item)}  # fmt: skip
    return out


def _pair_calibration_checks(
    key: Mapping[str, Any],
    preferences: Mapping[tuple[str, str], Mapping[str, str]],
    sample_scores: Mapping[tuple[str, str, str], Mapping[str, int]],
    raters: Sequence[str],
    tolerance: int,
) -> dict[str, list[tuple[str, bool]]]:
    """Per rater, ``("choice" | "score", missed)`` for every answer they gave that a calibration pair knows."""
    known = {i: k for i, k in key.items() if i != "models" and k["source"] == CALIBRATION}
    if not known:
        return {}
    checks: dict[str, list[tuple[str, bool]]] = {r: [] for r in raters}
    for rater in raters:
        for item, k in known.items():
            chosen = preferences.get((rater, item), {})
            checks[rater] += [("choice", chosen[d] != c) for d, c in k["prefer"].items() if d in chosen]
            for side, want in k["scores"].items():
                given = sample_scores.get((rater, item, side), {})
                checks[rater] += [("score", abs(given[d] - s) > tolerance) for d, s in want.items() if d in given]
    return checks


def _report_pairs(folder: Path, key: dict[str, Any], level: str, tolerance: int, max_miss_rate: float) -> dict:
    """:func:`report` of a side-by-side folder."""
    models = key["models"]
    preferences = load_preferences(folder)
    sample_scores = load_sample_scores(folder)
    raters = sorted({r for r, _ in preferences} | {r for r, _, _ in sample_scores})
    items = sorted(i for i, k in key.items() if i != "models" and k["source"] == SIDE_BY_SIDE)
    alpha, win_rate = {}, {m: {} for m in models}
    for dim in DIMENSIONS:
        outcomes = preference_outcomes(key, preferences, dim)
        matrix = np.array([[outcomes.get(i, {}).get(r, np.nan) for i in items] for r in raters], dtype=float)
        alpha[dim] = krippendorff_alpha(matrix.reshape(len(raters), len(items)), level) if raters else float("nan")
        for model, rate in _win_rates(outcomes, models).items():
            win_rate[model][dim] = rate
    score_alpha: dict[str, float] = {}
    scores: dict[str, dict[str, Any]] = {}
    if sample_scores:  # the 1-5 scores of the two completions: each completion of a run item is one unit
        units = [(i, side) for i in items for side in SIDES]
        for dim in DIMENSIONS:
            matrix = np.array(
                [[sample_scores.get((r, i, side), {}).get(dim, np.nan) for i, side in units] for r in raters],
                dtype=float,
            )
            score_alpha[dim] = krippendorff_alpha(matrix, level)
        for model in models:
            scores[model] = {}
            for dim in DIMENSIONS:
                per_item = []
                for item in items:
                    side = "A" if key[item]["A"] == model else "B"
                    given = [sample_scores[(r, item, side)][dim] for r in raters
                             if dim in sample_scores.get((r, item, side), {})]  # fmt: skip
                    if given:
                        per_item.append(float(np.mean(given)))
                scores[model][dim] = _summary(per_item)
    checks = _pair_calibration_checks(key, preferences, sample_scores, raters, tolerance)
    result = {"mode": SIDE_BY_SIDE, "models": models, "raters": raters, "alpha": alpha, "alpha_min": ALPHA_MIN,
              "unreliable": [d for d, a in alpha.items() if not (a >= ALPHA_MIN)], "win_rate": win_rate,
              "score_alpha": score_alpha,
              "unreliable_scores": [d for d, a in score_alpha.items() if not (a >= ALPHA_MIN)],
              "scores": scores, "calibration": _calibration_summary(checks, max_miss_rate)}  # fmt: skip
    return _write_report(folder, result)


def _md(text: str, limit: int = 100) -> str:
    """A name as Markdown text: cut to ``limit`` characters, control characters dropped, and the characters Markdown
    and HTML give a meaning (``<``, ``>``, ``&``, ``|``, backticks, ``*``, ``_``, brackets) escaped."""
    import html
    import unicodedata

    text = "".join(c for c in str(text) if not unicodedata.category(c).startswith("C"))
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    text = html.escape(text, quote=False)
    for ch in "\\|`*_[]#":
        text = text.replace(ch, "\\" + ch)
    return text


def _num(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _alpha_lines(alpha: Mapping[str, float], unreliable: Sequence[str], what: str) -> list[str]:
    lines = [f"| dimension | Krippendorff's alpha{what} | reliable (>= {ALPHA_MIN}) |", "|---|---|---|"]
    return lines + [f"| {d} | {_num(a)} | {'no' if d in unreliable else 'yes'} |" for d, a in alpha.items()]


def _scores_lines(scores: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    lines = ["| run | " + " | ".join(DIMENSIONS) + " |", "|---|" + "---|" * len(DIMENSIONS)]
    for source, dims in scores.items():
        cells = [f"{_num(v['mean'])} [{_num(v['low'])}, {_num(v['high'])}] (n={v['items']})" for v in dims.values()]
        lines.append(f"| {_md(source)} | " + " | ".join(cells) + " |")
    return lines


def _calibration_lines(calibration: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not calibration:
        return ["No calibration items."]
    lines = ["| rater | calibration answers | missed | flagged |", "|---|---|---|---|"]
    for rater, c in calibration.items():
        kinds = ", ".join(f"{m} of {n} {k}s" for k, (n, m) in c["by_kind"].items())
        missed = f"{c['missed']} ({kinds})" if len(c["by_kind"]) > 1 else str(c["missed"])
        lines.append(f"| {_md(rater)} | {c['scored']} | {missed} | {'yes' if c['flagged'] else 'no'} |")
    return lines


def _markdown(result: Mapping[str, Any]) -> str:
    lines = ["# Human evaluation", "", f"Raters: {', '.join(map(_md, result['raters'])) or 'none'}", ""]
    if result.get("mode") != SIDE_BY_SIDE:
        lines += _alpha_lines(result["alpha"], result["unreliable"], "")
        lines += ["", *_calibration_lines(result["calibration"]), "", *_scores_lines(result["scores"])]
        return "\n".join(lines) + "\n"
    lines += ["## Choices", "", *_alpha_lines(result["alpha"], result["unreliable"], " of the choices"), "",
              "Win rate: the share of the items not tied on which the raters (on average) preferred the run, "
              "with a 95% Wilson interval; alpha is that of the un-blinded choices (1 / 0.5 / 0 for the first run: "
              "preferred / tie / the other).", "",
              "| run | " + " | ".join(DIMENSIONS) + " |", "|---|" + "---|" * len(DIMENSIONS)]  # fmt: skip
    for model, dims in result["win_rate"].items():
        cells = [f"{_num(v['rate'])} [{_num(v['low'])}, {_num(v['high'])}] ({v['wins']}-{v['losses']}, "
                 f"{v['ties']} tied)" for v in dims.values()]  # fmt: skip
        lines.append(f"| {_md(model)} | " + " | ".join(cells) + " |")
    lines += ["", "## Scores (1-5)", ""]
    if result["score_alpha"]:
        lines += _alpha_lines(result["score_alpha"], result["unreliable_scores"], " of the scores")
        lines += ["", "Per run: the mean over items of the raters' mean score, with a 95% t-interval.", ""]
        lines += _scores_lines(result["scores"])
    else:
        lines.append("No 1-5 scores were given.")
    lines += ["", "## Calibration", "", *_calibration_lines(result["calibration"])]
    return "\n".join(lines) + "\n"
