"""ERA5: the tutorial's yearly HDF5 files (reader, ``data:`` section, layout checks, fast reads through
memory maps and hyperslabs) and the synthetic atmosphere that ``dlscale data synth-era5`` writes."""
