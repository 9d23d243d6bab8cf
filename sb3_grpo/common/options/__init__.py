"""The algorithms' arguments: their checks, run before any model is built (:mod:`.checks`)."""
