"""MNIST: the idx-file reader, its ``data:`` section, and ``dlscale data synth-mnist``."""
