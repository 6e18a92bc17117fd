"""The ``rt4`` command: parses flags into the run layer's models, calls it and prints (app); the flags
built from model fields (flags); an exception no command handled (crash)."""
