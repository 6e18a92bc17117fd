"""The embedded offline verifier: all-MiniLM-L6-v2 (minilm), its learned head (model, model.json;
fitted by fit), and the verifier backend with its guards (verifier)."""
