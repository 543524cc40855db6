"""The divergence guard: what a run does when its loss, gradients or weights become NaN or infinite, or its
loss explodes while still finite.

Three policies (``train.on_nonfinite``), each in ``policy.py`` with the ``DivergenceGuard`` that applies them:

* ``stop`` (default): the run ends as "diverged" (exit status 3), naming the step, the rule that fired, the
  scheduled learning rate and what to try; the last good checkpoint stays as it was.
* ``skip``: a step whose loss or gradient norm is not finite, or whose loss spikes, leaves the weights and the
  optimizer state as they were (up to ``train.max_skipped_steps``), and checkpoints wait for
  ``train.healthy_steps_before_save`` normal steps in a row.
* ``rollback``: the last good checkpoint is loaded again and the learning rate scaled by
  ``train.rollback_lr_factor``, up to ``train.max_rollbacks`` times.

The spike rule (``loss_spike.py``): a step's loss is a spike when it is more than ``train.loss_spike_factor``
times the median of the last ``train.loss_spike_window`` accepted step losses. The median, so that one hard
batch does not move the bar; skipped and spiking steps are not accepted, so a run that keeps exploding cannot
raise its own median. Every policy treats a spike as it treats NaN.

``nonfinite.py`` notices NaN and infinity without a host sync per step (a device-side record read every
``train.nonfinite_check_every`` steps) and scans a checkpoint's payload before it is written;
``final_weights.py`` decides which weights a distrusted run's end-of-run report describes (the last good
checkpoint's). The words of the divergence message, in the scale of ``optim.lr``, are ``run/divergence_advice.py``'s
(it reads the whole config).
"""
