"""``dlscale export`` and ``dlscale.load_model``: a trained model that works without its run directory.

An export is a directory: the weights as safetensors (``model.safetensors``, the serial model's whole state
dict), the run's resolved config (``config.yaml``), the statistics that normalize inputs and denormalize
outputs (``stats/*.npy``, from the workload's ``normalization_stats``), a ``torch.export`` program
(``model.pt2``, which loads with torch alone) and ``manifest.json`` (versions, the source checkpoint and its
step, the input and output shapes, the sha256 of every file). ``layout.py`` is the directory's format and its
check, ``source.py`` which checkpoint a command line names, ``program.py`` the torch.export program,
``writer.py`` the export, ``loader.py`` the way back (:class:`~dlscale.exported.loader.ExportedModel`).
"""
