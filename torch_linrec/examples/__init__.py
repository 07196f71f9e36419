"""Examples: :mod:`.lm`, a character-level language model on the Python standard library's sources
(``python -m torch_linrec.examples.lm --help``)."""
