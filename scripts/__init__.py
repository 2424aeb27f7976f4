"""The command-line scripts (each run as ``python scripts/NAME.py``) and, in support/,
the parts they share. A package so that ``scripts.support`` resolves here first."""
