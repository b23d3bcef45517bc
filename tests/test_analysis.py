"""Analysis: fresh results give every study's verdict rows and figures; planted errors fail."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from hpcpipe.studies.dimension_runs import DimensionPlan, sweep_text
from hpcpipe.studies.report import analyse, main

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

SWEEPS = {
    "pipeline-time": """
[sweep]
name = "pipeline-time"
ranks = "depth"
[base]
tag = "pipeline-time"
problem = "fewshot"
width = 4
optimizer = "pprs"
gamma = 0.01
lr = 0.01
iterations = 3
eval_every = 0
progress = "off"
[grid]
schedule = ["sequential", "gpipe"]
depth = [2, 3]
samples = [1, 3]
m = [1, 2]
""",
    "depth": """
[sweep]
name = "depth"
ranks = "depth"
[base]
tag = "depth"
mode = "theory"
epsilon = 0.5
dim = 8
problem = "l1-chain"
progress = "off"
[grid]
optimizer = ["gd", "pprs"]
depth = [1, 2, 3]
""",
    # PPRS on pinball-chain at d = 8, 16, 32 (ε = 0.25, two seeds), on MPI
    "dimension": sweep_text(
        DimensionPlan(
            dims=(8, 16, 32),
            eps=0.25,
            depth=1,
            seeds=(0, 1),
            settings=("plan", "c4", "c8", "gamma30"),
            executor="mpi",
        )
    ),
    "smooth": """
[sweep]
name = "smooth"
ranks = "depth"
[base]
tag = "smooth"
problem = "quad-chain"
optimizer = "agd"
mode = "theory"
dim = 64
progress = "off"
[grid]
depth = [1, 2]
epsilon = [1e-3, 1e-4]
""",
    "paper": """
[sweep]
name = "paper"
ranks = 2
[base]
tag = "paper"
problem = "attack-targeted"
depth = 2
width = 16
m = 1
radius = 0.2
iterations = 100000
time_budget = 200
progress = "off"
[[cases]]
label = "gd"
optimizer = "gd"
[[cases]]
label = "pprs-k2"
optimizer = "pprs"
samples = 2
gamma = 0.05
[[cases]]
label = "pprs-k10"
optimizer = "pprs"
samples = 10
gamma = 0.05
[grid]
lr = [1e-2, 1e-1]
""",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for name, text in SWEEPS.items():
        f = root / f"{name}.toml"
        f.write_text(text)
        p = subprocess.run(
            [sys.executable, "-m", "hpcpipe", "sweep", str(f), "--out", str(root / name)],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=600,
        )
        assert p.returncode == 0, p.stdout + p.stderr
    return root


def test_each_study_gives_its_verdicts_and_figure(results, tmp_path):
    studies, report = analyse([str(results)], tmp_path / "report")
    by = {s.name: s for s in studies}
    assert set(by) == {"pipeline-time", "depth", "dimension", "smooth", "paper"}
    for name, s in by.items():
        assert s.verdicts, name
        for fig in s.figures:
            assert (tmp_path / "report" / fig).stat().st_size > 2000
    assert by["pipeline-time"].figures and by["depth"].figures and by["smooth"].figures
    assert by["dimension"].figures and by["paper"].figures
    bounds = [v for s in studies for v in s.verdicts if v.kind == "bound" and v.ok is not None]
    assert bounds and all(v.ok for v in bounds), [v for v in bounds if not v.ok]
    text = report.read_text()
    assert "| study | claim | bound | measured | verdict | executor | sources |" in text
    assert all(v.executor == "mpi" for s in studies for v in s.verdicts)  # sweeps run on MPI
    for s in studies:  # every verdict row names the files its numbers came from
        for v in s.verdicts:
            assert v.files and all(f.endswith(".h5") for f in v.files)
            assert v.files[0] in text
    claims = [v for v in by["paper"].verdicts if v.kind == "claim"]
    assert claims and all(v.word in ("reproduced", "not reproduced") for v in claims)


def test_planted_iteration_time_breaks_the_law(results, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(results / "pipeline-time", bad)
    victim = sorted(bad.glob("*gpipe*depth=3*samples=3*m=2*.h5"))[0]
    with h5py.File(victim, "r+") as f:
        f["iterations/pipeline_time"][...] *= 1.5  # 50% slower than (K m + S - 1) says
    assert main([str(bad), "-o", str(tmp_path / "r"), "--study", "pipeline-time"]) == 1
    text = (tmp_path / "r" / "report.md").read_text()
    assert "VIOLATED" in text and victim.name in text


def test_analysis_skips_unreadable_files(results, tmp_path):
    d = tmp_path / "mixed"
    shutil.copytree(results / "smooth", d)
    (d / "zz-truncated.h5").write_bytes(Path(next(d.glob("*.h5"))).read_bytes()[:500])
    warnings = []
    studies, _ = analyse([str(d)], tmp_path / "r", ["smooth"], warn=warnings.append)
    assert any("zz-truncated.h5" in w for w in warnings)
    assert studies and studies[0].verdicts


def test_trivial_instance_fails_the_depth_check(results, tmp_path):
    """ε above f(θ₀) − f* measures nothing: the depth study says so and fails."""
    bad = tmp_path / "trivial"
    shutil.copytree(results / "depth", bad)
    studies, _ = analyse([str(bad)], tmp_path / "ok", ["depth"])
    reach = [v for v in studies[0].verdicts if v.kind == "bound" and "reaches eps =" in v.claim]
    assert reach and all(v.ok for v in reach)  # the shipped ε is below the initial gap
    victim = sorted(bad.glob("*.h5"))[0]
    with h5py.File(victim, "r+") as f:
        info = json.loads(f.attrs["info"])
        assert info["initial_gap"] > 0.5  # l1-chain, d = 8: f(0) - f* is about 0.8
        info["initial_gap"] = 0.4  # as if θ₀ were already within ε = 0.5
        f.attrs["info"] = json.dumps(info)
    assert main([str(bad), "-o", str(tmp_path / "r"), "--study", "depth"]) == 1
    text = (tmp_path / "r" / "report.md").read_text()
    assert "the instance is trivial" in text and "VIOLATED" in text


FIGURES = {
    "pipeline_time.png",
    "depth.png",
    "dimension.png",
    "smooth.png",
    "paper_attack_curves.png",
    "paper_attack_stability.png",
}


def test_every_figure_has_units_title_a_legend_off_the_curves_and_the_reported_fit(
    results, tmp_path, monkeypatch
):

    from hpcpipe.studies import report

    figs = {}
    for mod in report.STUDIES.values():

        def keep(fig, outdir, name, res, _save=mod.save_figure):
            figs[name] = fig
            _save(fig, outdir, name, res)

        monkeypatch.setattr(mod, "save_figure", keep)
    studies, _ = analyse([str(results)], tmp_path / "report")
    verdicts = {v.claim: v.measured for s in studies for v in s.verdicts}
    assert set(figs) == FIGURES
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    maps = {n for n in figs if n.endswith("_stability.png")}  # heat maps: a colour bar, no legend
    for name in maps:
        fig = figs[name]
        cbars = [ax for ax in fig.axes if re.search(r"\((logits|nats)\)", ax.get_ylabel())]
        assert cbars, f"{name}: the colour bar names its unit"
        for ax in fig.axes:
            if ax not in cbars and ax.axison:
                assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), name
    for name, fig in figs.items():
        if name in maps:
            continue
        canvas = FigureCanvasAgg(fig)  # the saved figure is closed: draw it again
        canvas.draw()
        renderer = canvas.get_renderer()
        width, height = fig.get_size_inches() * 110  # pixels as written (dpi 110)
        assert width >= 700 and height >= 400, name
        suptitle = fig._suptitle.get_text() if fig._suptitle else ""
        for ax in fig.axes:
            shared = ax.get_shared_x_axes().get_siblings(ax)  # a column's panels share one
            assert any(o.get_xlabel() for o in shared) and ax.get_ylabel(), name
            assert ax.get_title() or suptitle, name
            legend = ax.get_legend()
            assert legend is not None and legend.get_texts(), name
            box, frame = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert box.x0 >= frame.x1 - 1, f"{name}: the legend covers the axes"
            assert fig.get_window_extent(renderer).x1 >= box.x1 - 1, f"{name}: legend cut off"
            for text in [*legend.get_texts(), ax.xaxis.label, ax.yaxis.label]:
                assert text.get_fontsize() >= 7, name
        data_axes = [ax for ax in fig.axes if "residual" not in ax.get_ylabel()]
        for ax in data_axes:  # a unit in brackets on the measured axis
            assert re.search(r"\((tau|s|count|logits|nats|ratio)\)", ax.get_ylabel()), (
                name,
                ax.get_ylabel(),
            )
    # pipeline time: a panel and a residual panel per clock, a fit per schedule in the legend,
    # with the coefficient the verdict reports, and distinct colours per schedule
    pt = figs["pipeline_time.png"]
    top = [ax for ax in pt.axes if "residual" not in ax.get_ylabel()]
    assert len(pt.axes) == 2 * len(top)
    labels = [t.get_text() for t in top[0].get_legend().get_texts()]
    for sched in ("sequential", "gpipe"):
        fit = next(lab for lab in labels if lab.startswith(f"fit {sched}:"))
        a = fit.split(": ")[1].split("*")[0]
        measured = next(m for c, m in verdicts.items() if c.startswith(f"{sched} iteration time"))
        assert f"a = {a}," in measured
    colors = {line.get_color() for line in top[0].get_lines() if line.get_linestyle() == "None"}
    assert len(colors) == 2
    # dimension: the fitted exponent drawn is the one the table reports
    dim = [t.get_text() for t in figs["dimension.png"].axes[0].get_legend().get_texts()]
    fit = next(lab for lab in dim if lab.startswith("fit: d^"))
    exponent = fit.removeprefix("fit: d^").split(" ")[0]
    assert any(m.startswith(f"exponent {exponent} ") for m in verdicts.values())
    assert any(lab.startswith("prediction: c * d^(1/4)") for lab in dim)
    assert any(lab.startswith("speed limit") for lab in dim)
    # smooth: the fit line with the slope the table reports, and the bound
    sm = [t.get_text() for t in figs["smooth.png"].axes[0].get_legend().get_texts()]
    slope = next(lab for lab in sm if lab.startswith("fit: slope")).split()[2]
    assert any(m.startswith(f"slope {slope} ") for m in verdicts.values())
    assert any("upper bound" in lab for lab in sm)
    # depth: the bound's planned time is marked
    dp = [t.get_text() for t in figs["depth.png"].axes[0].get_legend().get_texts()]
    assert any(lab.startswith("bounds' constants") for lab in dp)
    assert any(lab.startswith("from iteration counts") for lab in dp)


def test_report_table_lists_sources_as_short_references(results, tmp_path):
    _, path = analyse([str(results)], tmp_path / "report")
    text = path.read_text()
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| study | claim"))
    table = []  # the verdict table: the rows up to its first blank line
    for line in lines[head:]:
        if not line.startswith("| "):
            break
        table.append(line)
    assert table[0].endswith("| sources |") and len(table) > 3
    for row in table[2:]:
        assert ".h5" not in row and re.search(r"S\d+ \(\d+ files?\) \|$", row)
    appendix = text[text.index("## Sources") :]
    assert appendix.count(".h5") >= 10
