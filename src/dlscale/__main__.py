"""`python -m dlscale ...` is the same as the `dlscale` console script (torchrun needs the module form)."""

from dlscale.cli import main

raise SystemExit(main())
