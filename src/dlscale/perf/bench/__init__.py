"""Throughput trials and what they mean: benchy's IO / SYNTHETIC / FULL trials (``dlscale bench``), their
verdicts with 95% intervals, sweeps over one setting, weak and strong scaling across GPU counts, and the plots."""
