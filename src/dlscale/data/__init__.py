"""Training data: one sub-package per data domain (``era5``, ``cosmo``, ``mnist``, ``cifar``: each its reader, its
``data:`` config section and its ``dlscale data synth-*`` generator), beside two packages that every domain uses:
``loading`` (samplers, loaders, the ``pytorch`` and ``gpu`` pipelines, device prefetch) and ``values``
(normalization, the NaN/inf check, ``.npy`` reading without unpickling). At this level only what a domain
implements for the rest of dlscale: how a data set describes itself (``dataset_description``), how a generator
writes one (``synth_output``) and what a rollout reads (``trajectories``: the ``Trajectories`` protocol)."""
