"""WeatherBench2's climatology by day of year and hour of day: computed from dlscale's year files, written as a
zarr store in WeatherBench2's layout, and read back (ours, or one WeatherBench2 publishes) for the anomaly
correlation and the climatology forecaster of ``dlscale forecast``.

* :mod:`~dlscale.data.era5.climatology.calendar`: the plain day of year (1..366) and hour of day of a time;
* :mod:`~dlscale.data.era5.climatology.window`: the 61-day triangular window and the windowed mean over days
  and years (WeatherBench2's ``compute_rolling_stat``);
* :mod:`~dlscale.data.era5.climatology.years`: ``--years 1990-2019`` / ``--climatology-years``;
* :mod:`~dlscale.data.era5.climatology.computing`: the sums over a split's year files, streamed by channel and
  latitude band;
* :mod:`~dlscale.data.era5.climatology.store_layout`: WeatherBench2's climatology layout (dims, variable names,
  chunks, attributes) and writing it atomically;
* :mod:`~dlscale.data.era5.climatology.building`: ``dlscale data climatology`` (and the end of an import): the
  checks, the computation into a temporary store and its publication under the store's lock;
* :mod:`~dlscale.data.era5.climatology.coverage`: the days of the year a store has no data for, in words, and
  what a forecast does on them;
* :mod:`~dlscale.data.era5.climatology.reading`: opening a climatology store and the fields at given valid
  times, on our grid and channels.

xarray and zarr are optional (the ``era5`` extra); the modules that need them import them inside functions.
"""
