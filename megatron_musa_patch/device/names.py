"""The rows' names, importable without torch (the table itself, ``rows``, imports torch): for a
process that only names a row to the processes it starts (``mmp checkpoint``'s own)."""

MUSA = "musa"
CPU = "cpu"
CUDA = "cuda"
