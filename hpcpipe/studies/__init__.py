"""Scaling studies: sweeps, Slurm job folders and the analysis of their results."""
