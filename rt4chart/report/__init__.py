"""What people read: progress and the summary, the terminal view, the HTML report and its templates,
CI formats (JUnit, GitHub annotations), the diff and agreement views, the review plan, and the one
publish step that writes a finished run's outputs."""
