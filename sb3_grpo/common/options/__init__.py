"""The algorithms' arguments: their checks, run before any model is built (:mod:`.checks`), the schedules' values
checked each time an update evaluates them (:mod:`.schedule_values`), and what each algorithm supports
(:mod:`.support`)."""
