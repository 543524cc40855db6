"""dlscale: train scientific deep-learning models at scale, from one CPU to many GPU nodes, and make them fast."""

__version__ = "0.1.0"
