"""Checkpoints: the file format, the run's checkpoint directory, layout-free (sharded) state, saving and
restoring a training run, and the ``checkpoint:`` config section."""
