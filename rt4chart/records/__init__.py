"""The run's records on disk: the JSONL reader and the resumable, guarded writer (io), OTLP/JSON trace
exports read as input items (traces), and the manifest that makes a run an artifact (manifest)."""
