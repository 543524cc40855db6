"""Memory planning before a run (``dlscale plan``): the ViT's cost model of every dp x tp x cp layout, and for
any other model a traced step on fake tensors (what autograd saves, per GPU, per layout); and
``--check_layout``: one rank of an N-GPU layout built on a fake process group (``layout_check.py``)."""
