"""The version of dlscale (a leaf every layer may import; the package root is the API facade above them)."""

__version__ = "0.1.0"
