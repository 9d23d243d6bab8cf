"""What a rollout adds to SB3's ``collect_rollouts``: its state (:mod:`.rollout_extras`), rewards scored in the
background (:mod:`.deferred_rewards`), reward redistribution (:mod:`.redistribution`), non-finite handling
(:mod:`.nonfinite`) and the trainer state the env's rewards read (:mod:`.trainer_state_push`)."""
