"""Training data: one sub-package per data domain (``era5``, ``cosmo``, ``mnist``, ``cifar``: each its reader, its
``data:`` config section and its ``dlscale data synth-*`` generator), and at this level the machinery they share:
which samples each rank reads (``sampler``), how batches reach the device (``loader``, ``pipeline``,
``gpu_pipeline``, ``prefetch``, ``batch_reads``), normalization on the device, the NaN/inf check, ``.npy`` reading
without unpickling, and how a generator writes a data set (``synth_output``)."""
