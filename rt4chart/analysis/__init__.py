"""Figures over finished records: metrics against gold, agreement between judges, diffs of two runs,
reviews and their agreement, calibration of operating points, and the labelled datasets."""
