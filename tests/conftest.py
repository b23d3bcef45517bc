"""The MPI tests under tests/mpi run only inside `mpiexec -n 4 pytest --with-mpi`.

The plain `pytest` command starts that run itself (tests/test_mpi_suite.py),
so one command runs everything and a failing or skipped MPI test fails it.
"""

import os

collect_ignore = [] if os.environ.get("HPCPIPE_MPI_SUITE") == "1" else ["mpi"]

# The fast lane, `python -m pytest -m "not slow"` (<= 60 s on 2 idle cores): a core per
# area, every other test marked slow here. The full `python -m pytest` runs everything.
# Core modules (their heavy tests excepted below): gradients, the simulator's exactness,
# the model and schedules, config errors and defaults, result files (units, a killed
# writer, resume), the CLI and its help, the docs' coverage of commands and settings,
# progress, verdict rules; the MPI suite's core is test_mpi_suite.py[core].
FAST_MODULES = {
    "test_bad_config.py",
    "test_cli_refusals.py",
    "test_commands.py",
    "test_defaults.py",
    "test_docs.py",
    "test_gradients.py",
    "test_help.py",
    "test_model.py",
    "test_mpi_suite.py",
    "test_outcome.py",
    "test_progress.py",
    "test_readme.py",
    "test_results.py",
    "test_schedules.py",
    "test_simulated.py",
    "test_simulator_fast.py",
    "test_stop_at_epsilon.py",
    "test_units.py",
    "test_verdicts.py",
}
# heavy tests of the core modules (seconds on a loaded machine; kept in the full run)
SLOW_TESTS = (
    "test_bad_config.py::test_random_command_lines_run_or_exit_2",
    "test_bad_config.py::test_random_toml_files_run_or_exit_2",
    "test_cli_refusals.py::test_sweep_np_above_the_file_ranks_says_so_in_one_line",
    "test_progress.py::test_the_attack_classifier_training_shows_its_progress",
    "test_commands.py::test_top_level_help_imports_no_numerical_library",
    "test_docs.py::test_oracle_example_runs_on_4_ranks_and_frees_its_requests",
    "test_gradients.py::test_depth8_chain_gradient[mlp-weights]",
    "test_results.py::test_chrome_trace_structure_and_gantt_png",
    "test_results.py::test_sigterm_flushes_and_marks_incomplete",
    "test_results.py::test_exception_leaves_a_resumable_file_and_resume_is_bitwise[2]",
    "test_simulated.py::test_config_checks_of_the_stage_count",
)


def pytest_collection_modifyitems(config, items):
    """Mark slow every test outside the fast lane (FAST_MODULES minus SLOW_TESTS)."""
    import pytest

    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if "/mpi/" in f"/{path}":  # the MPI tests: their core is chosen in tests/mpi/conftest.py
            continue
        name = path.rsplit("/", 1)[-1]
        local = item.nodeid[len(path) - len(name) :]
        if name not in FAST_MODULES or local.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
