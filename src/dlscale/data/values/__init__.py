"""The values of a data set, whatever its domain: normalization statistics applied on the device
(``normalization``), the check that a batch holds no NaN or infinity (``finite_check``) and ``.npy`` arrays read
without unpickling (``npy_files``)."""
