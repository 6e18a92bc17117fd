"""The ``rt4`` command: the app and its console script (app), one module per command group (audit:
verify and estimate; results: report, show, diff, review-plan; evaluation: eval, score, convert,
calibrate, agree, compare; repair; judges: judges, serve, cache; signals), what they share (common),
the flags built from model fields (flags) and an exception no command handled (crash)."""
