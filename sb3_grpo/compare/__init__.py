"""What ``sb3-grpo compare`` and ``sb3-grpo report`` run: algorithms over seeds on one env, and their report.

- :mod:`.algos`: the table of algorithms (``--algos``) and their constructor defaults;
- :mod:`.config`: a comparison's settings, checked before anything is written (:class:`~.config.CompareError`);
- :mod:`.runner`: building envs and models, training and evaluating each run, ``results.json`` after every run;
- :mod:`.results`: the out dir (fresh, ``--overwrite``, ``--resume``) and ``results.json``;
- :mod:`.stats`: interval estimates for few-seed results, and the verdict rule of the claim check;
- :mod:`.report`: ``report.md`` and ``curves.png`` from ``results.json`` alone;
- :mod:`.progress`: the live progress display;
- :mod:`.pages`: results pages (Markdown stamped with the command, commit, hardware and date).

The lab (``textrl-bench``: throughput, the claims study) reuses these; this package never imports it.
"""
