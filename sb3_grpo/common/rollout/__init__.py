"""What a rollout adds to SB3's ``collect_rollouts``: its state (:mod:`.rollout_extras`), rewards scored in the
background (:mod:`.deferred_rewards`), reward redistribution (:mod:`.redistribution`) and non-finite handling
(:mod:`.nonfinite`)."""
