"""``dlscale data import-era5``: ERA5 from a zarr store or netCDF files into the tutorial's HDF5 layout.

``importer.py`` runs the import (see its docstring for the layout written, memory and resume); its pieces:
``names.py`` (a channel's name in ARCO-ERA5, WeatherBench2 and CDS stores), ``source.py`` (opening the source
with xarray and checking its coordinates, grid and time axis; a damaged chunk or file is one line),
``source_paths.py`` (what a source path names, and why one is no store or netCDF file), ``plan.py`` (``--split`` and ``--dt``: which
steps go into which year file), ``year_writer.py`` (one year file, written in blocks while the next is read),
``statistics.py`` (the means, standard deviations and climatology in the same pass), ``output.py`` (whose the
output directory is, what a rerun may skip) and ``progress.py`` (the bar with GB/s, or plain lines in a log).
"""
