"""utils: the plumbing every folder shares, talking to nothing outside the process.

Owns: the user-facing errors and the translation of Google and Kubernetes API errors into one
sentence (``errors``), name validation and derivation (``names``), the Hugging Face token and its
redaction (``tokens``), the one poller (``poll``), a plan of changes and the one wording of a plan's
epilogue when nothing changed (``plan``), a ``doctor`` check's result (``checks``), and where the
repository is (``paths``).

May import: nothing of gemma3_ray outside utils.
"""
