"""STUB (not from SGLang): see ../../README.md."""
