"""One run: configuration, the run loop, HDF5 results, traces and tables."""
