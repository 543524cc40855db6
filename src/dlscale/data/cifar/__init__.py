"""CIFAR-100: the binary-version reader, its ``data:`` section, and ``dlscale data synth-cifar``."""
