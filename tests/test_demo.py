"""The crossover demo's numbers (hpcpipe.demos.crossover) and the stop-at-epsilon rule it uses."""

import math

import numpy as np
import pytest
from mpi4py import MPI

from hpcpipe.demos import crossover as demo
from hpcpipe.run.config import ConfigError, make_config
from hpcpipe.run.runner import run

SELF = MPI.COMM_SELF


def _law_cells(i_gd: float, i_pp: float, K: int, depths) -> list:
    """Cells whose times follow the GPipe law I·2(K + Δ − 1) exactly."""
    out = []
    for d in depths:
        out.append(demo.Cell("gd", d, "simulated", i_gd, i_gd * 2 * d, 1))
        out.append(demo.Cell("pprs", d, "simulated", i_pp, i_pp * 2 * (K + d - 1), K))
    return out


def test_crossover_from_counts_is_the_law_and_the_measured_one_interpolates():
    depths = [2, 4, 8, 16, 32, 64, 256]
    x = demo.crossover(_law_cells(64, 36, 16, depths), 4, (1024, 725, 16))
    assert x.from_counts == pytest.approx(36 * 15 / (64 - 36), rel=1e-12)
    assert x.from_bounds == pytest.approx(725 * 15 / (1024 - 725), rel=1e-12)
    # times affine in depth with fixed counts: the interpolated crossing is the law's, exactly
    assert 16 < x.measured < 32 and x.measured == pytest.approx(x.from_counts, rel=1e-12)
    assert x.ratio[-1] == pytest.approx(64 * 256 / (36 * (16 + 255)), rel=1e-12)
    assert "from about 19 layers on PPRS reaches eps first" in demo.summary(x)


def test_planted_depth_per_sample_pprs_shows_no_crossover():
    """PPRS on the sequential schedule pays the depth for every sample: the demo's measured
    crossover disappears and its sentence says so."""
    cells = []
    for d in (4, 64, 256):
        cells.append(demo.run_cell(SELF, "gd", d, "simulated"))
        cells.append(demo.run_cell(SELF, "pprs", d, "simulated", schedule="sequential"))
    x = demo.crossover(cells, 4, (1024, 725, 16))
    assert math.isinf(x.measured) and x.ratio[-1] < 1
    assert "did not overtake GD" in demo.summary(x)


def test_stop_at_epsilon_stops_at_the_first_iterate_within_epsilon():
    values = demo.settings("gd", 4, "simulated")
    full = run(make_config({**values, "stop_at_epsilon": 0}), SELF)
    stopped = run(make_config(values), SELF)
    gap = np.asarray(full.column("gap"))
    first = int(np.flatnonzero(gap <= values["epsilon"])[0]) + 1
    assert len(stopped.table) == first < len(full.table)
    assert stopped.status == "complete" and stopped.info["stopped_at_epsilon"] == first
    for col in ("loss", "gap", "pipeline_time"):  # the same iterates up to the stop
        assert np.asarray(stopped.column(col)).tolist() == full.column(col)[:first].tolist()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"epsilon": 0.0}, "stop_at_epsilon = 1 needs epsilon > 0"),
        ({"eval_every": 0}, "stop_at_epsilon = 1 needs evaluations of f (eval_every >= 1)"),
        ({"stop_at_epsilon": 2}, "stop_at_epsilon"),
    ],
)
def test_stop_at_epsilon_refuses_what_it_cannot_measure(over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config({**demo.settings("gd", 4, "simulated"), **over})
