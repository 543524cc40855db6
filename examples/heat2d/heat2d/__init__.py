"""heat2d: an out-of-tree dlscale workload, a CNN surrogate of the 2D heat equation (see README.md).

Importing the package imports no torch: ``heat2d.config`` is what reading a config needs, and
``heat2d.workload`` (the entry point) brings in the model.
"""

__version__ = "0.1.0"
