"""Saved models on disk: saving and loading the algorithms (:mod:`.save_load`), finding, checking and writing
checkpoint files (:mod:`.files`), the run a checkpoint folder belongs to (:mod:`.run_record`), and loading that runs
no code from the file (:mod:`.safe_loading`: the restricted unpickler of :mod:`.unpickling` and the safetensors format
of :mod:`.safetensors_format`)."""
