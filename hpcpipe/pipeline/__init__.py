"""The pipeline: schedules as data, their dependency walk and simulator, clocks,
transport, the MPI engine that executes a schedule, and per-action recording."""
