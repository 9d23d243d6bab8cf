"""Saved models on disk: finding, checking and writing checkpoint files (:mod:`.files`)."""
