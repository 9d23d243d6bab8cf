"""Human evaluation of sampled completions: export a blind, shuffled rating set, rate it on a local web page, report.

``sb3-grpo human-eval export`` takes completions (the JSONL files of :class:`~sb3_grpo.callbacks.CompletionLogger` or
``sb3-grpo sample --out``) from one run or two, draws ``n`` from each, mixes in calibration items of known score and
shuffles them into a folder: ``items.json`` (what raters see: no run names) and ``key.json`` (which run, or which known
scores, each item has). ``human-eval serve`` serves a page on which a rater scores each item from 1 to 5 on
:data:`DIMENSIONS`; every score is appended to ``ratings.jsonl`` (flushed and fsynced) the moment it is entered, so
nothing is lost when the page or the server closes, and a rater who comes back continues where they stopped.
``human-eval report`` computes Krippendorff's alpha per dimension (the ``krippendorff`` package, extra
``textrl[human-eval]``), flags a dimension whose alpha is below 0.7 and raters who miss the calibration items, and
writes the scores per run with 95% intervals.

Side by side (:func:`export_pairs`, ``human-eval export --side-by-side``): the completions of two runs on the same
prompts are paired, and which run is shown as A and which as B is drawn per item (``key.json`` holds it; the server
never serves that file). On the page a rater picks, per dimension, A, B or tie, and also scores each of the two
completions from 1 to 5 on the same dimensions; calibration pairs of known preference and/or known scores are mixed
in, shown like the others. ``human-eval report`` then un-blinds the choices and writes each run's win rate per
dimension with a Wilson interval, over items (the raters' choices on an item are averaged first), Krippendorff's
alpha of the un-blinded choices and of the 1-5 scores, each run's scores with 95% intervals, and flags raters who
miss the calibration pairs.
"""

from sb3_grpo.human_eval.export import check_export_folder, export_items, export_pairs
from sb3_grpo.human_eval.protocol import (
    ALPHA_MIN,
    ANCHORS,
    DIMENSIONS,
    PREFERENCES,
    load_preferences,
    load_ratings,
    load_sample_scores,
    repair_ratings,
)
from sb3_grpo.human_eval.report import krippendorff_alpha, preference_outcomes, report
from sb3_grpo.human_eval.server import make_server

__all__ = [
    "ALPHA_MIN",
    "ANCHORS",
    "DIMENSIONS",
    "PREFERENCES",
    "check_export_folder",
    "export_items",
    "export_pairs",
    "krippendorff_alpha",
    "load_preferences",
    "load_ratings",
    "load_sample_scores",
    "make_server",
    "preference_outcomes",
    "repair_ratings",
    "report",
]
