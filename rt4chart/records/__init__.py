"""The run's records on disk: the JSONL reader and the resumable, guarded writer (io), and the
manifest that makes a run an artifact (manifest)."""
