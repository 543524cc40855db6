"""Assembling and running a whole run from its config: the one layer that reads every section and hands each
component its own (the commands and the Python API sit on top of it)."""
