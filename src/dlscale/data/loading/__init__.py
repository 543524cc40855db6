"""How samples reach the model, for every data domain: which samples each rank reads (``sampler``), the
``loader:`` section (``loader_config``), the PyTorch DataLoader and its workers (``loader``), the two pipelines
that ``loader.pipeline`` chooses between (``pipeline``: the ``pytorch`` one; ``gpu_pipeline``: whole batches
read and normalized on the device), copies to the device ahead of the step (``prefetch``) and reads of a batch's
samples in one call (``batch_reads``)."""
