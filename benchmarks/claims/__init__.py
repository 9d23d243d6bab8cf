"""The claims study (``textrl-bench claims``): what runs (:mod:`.experiments`, :mod:`.tuning`), how (:mod:`.runner`,
:mod:`.study`, :mod:`.diagnostics`) and the verdict per claim (:mod:`.verdicts`, :mod:`.report`). It reuses the
comparison's runner and statistics from :mod:`sb3_grpo.compare`."""
