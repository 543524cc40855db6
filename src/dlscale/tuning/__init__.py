"""``dlscale tune``: the climb over the optimization knobs (``climb``), the knobs and their order per verdict
(``knobs``), finished trials kept so an interrupted tune continues (``cache``), the real measurements through
bench trials and short training runs (``run_backend``), settings and config keys (``settings``), one tune on
every rank (``session``) and the tuned YAML, table, figure and JSON (``report``). The package is ``tuning``, not
``tune``, so that ``dlscale.tune`` is the API's function."""
