"""Dark matter -> gas volumes of the U-Net tutorials: the HDF5 reader with random crops and the cube's 24
orientations, its ``data:`` section, and ``dlscale data synth-cosmo``."""
