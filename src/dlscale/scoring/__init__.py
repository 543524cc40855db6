"""Scoring: the math and the running sums of every number a validation, an evaluation or a forecast reports.

Where each score is computed:

* ``metrics.py``: per-sample math on gridded fields (the relative L2 loss, cos(latitude) weights, the
  latitude-weighted RMSE per channel) and ``MetricSums``, the per-sample sums and counts that every evaluator
  keeps, summed over data-parallel ranks and divided once at the end (means of sums, not means of batch means).
* ``evaluator.py``: the ``Evaluator`` protocol (reset, update, reduce_across_ranks, summary), what a summary
  carries (``EvalSummary``: loss, scalars, headline and baseline, ``ChannelSkill``, ``ClassCounts``,
  ``ExampleImage``) and ``evaluate``, the validation pass that drives an evaluator over a loader.
* ``loss_evaluator.py``: the workload's loss as its only metric (a workload without an evaluator of its own).
* ``metric_evaluator.py``: an evaluator from a function of (prediction, target) and an optional baseline
  predictor, with skill per metric and per channel.
* ``classification.py``: loss, top-1 accuracy, the confusion matrix, chance and the majority-class baseline.
* ``forecast_scores.py``: WeatherBench2's latitude-weighted RMSE and ACC per lead and channel, as float64 sums
  per initial time.
* ``ensemble_scores.py``: an ensemble's scores per lead and channel, WeatherBench2's: ensemble-mean RMSE, fair
  CRPS, spread, spread/skill ratio (with the finite-ensemble factor) and the rank histogram.
* ``climatologies.py``: the ACC's reference, a field per valid time (WeatherBench2's climatology by day of year
  and hour of day) or one mean field.
* ``spectra.py``: WeatherBench2's zonal energy spectrum at mid-latitudes per lead and channel (the model's and the
  truth's, as float64 sums per initial time) and the small-scale energy ratio: how much a forecast blurs.
* ``rollout.py``: autoregressive rollouts through a workload's trajectories, scored for the model, persistence
  and the climatology at every lead, and an ensemble's members beside its control.
* ``perturbation_spec.py`` and ``perturbations.py``: what makes an ensemble's members differ (``--perturb``):
  Gaussian initial-state noise correlated over a length in km, or the model's dropout kept on.
* ``rollout_ranks.py``: a rollout's sums added up over the ranks that shared its initial times.

What stays with a workload (``dlscale.workloads``) is what is its own: which channels and units it reports, which
baseline it is compared with (persistence for ERA5, the mean density for the cosmology cubes), its headline and
its log lines (``era5_metrics.py``, ``cosmo_metrics.py``, ``mnist_metrics.py``). ``report/`` writes the files and
figures of these numbers; ``run/`` assembles the passes (``dlscale evaluate``, ``dlscale forecast``).

Where a new score goes: a per-sample formula beside its kind (fields: ``metrics.py``; classes:
``classification.py``), accumulated in a ``MetricSums`` so that it is exact over batches and ranks; a score of
a forecast per lead (e.g. CRPS of an ensemble) in its own module beside ``forecast_scores.py``, with sums per
initial time, called from ``rollout.py``; a test against a direct computation of the formula.
"""
