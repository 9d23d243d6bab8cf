"""The update's pieces: the two update paths (:mod:`.batch_sources`), its statistics (:mod:`.train_stats`) and the
release of freed host memory (:mod:`.host_memory`)."""
