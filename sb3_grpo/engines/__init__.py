"""Rollout engines: who computes a text rollout's tokens. The per-step reference (:mod:`.step`), the policy's built-in
decoder a turn at a time (:mod:`.turn_queues`), and vLLM in the training process (:mod:`.vllm_engine`, an extra)."""
