"""The error of reading what only a finished sample reveals, apart from `aprilsim.types`.

mypyc may compile `types` (the opt-in compiled build, `docs/development.md`), and a compiled class
cannot subclass `RuntimeError`; `aprilsim.types` re-exports it.
"""


class UnfinishedSampleError(RuntimeError):
    """A scheduler read what only a finished sample reveals (its reward)."""
