"""Chrome traces and Gantt charts: iterations end to end, one track per stage, messages."""

from collections import defaultdict

import numpy as np
import pytest

from hpcpipe.pipeline.simulator import gantt_rows, simulate_uniform
from hpcpipe.run.trace import chrome_trace, gantt_figure

S, N, ITS = 3, 4, (1, 2, 3, 5)  # stages, items, recorded iterations (4 was not recorded)


def model_timeline():
    """A model-clock timeline as the engine records it: every call's times start at 0."""
    sim = simulate_uniform("1f1b", S, N, 1.0, 2.0, 0.5, record=True)
    cols = defaultdict(list)
    for it in ITS:
        for s, row in enumerate(gantt_rows(sim)):
            prev = 0.0
            for start, end, kind, item in row:
                for k, v in zip(
                    ("iteration", "rank", "stage", "kind", "item", "wait", "start", "end"),
                    (it, s, s, kind == "B", item, prev, start, end),
                ):
                    cols[k].append(v)
                prev = end
    tl = {
        k: np.array(v, dtype=float if k in ("wait", "start", "end") else np.int64)
        for k, v in cols.items()
    }
    per_call = sim.makespan
    table = {"iteration": np.arange(1, 6.0), "pipeline_time": per_call * np.arange(1, 6.0)}
    return tl, table, per_call


def slices(obj):
    return [e for e in obj["traceEvents"] if e["ph"] == "X"]


def test_slices_never_overlap_on_a_track_and_iterations_follow_each_other():
    tl, table, per_call = model_timeline()
    obj = chrome_trace(tl, "model", table=table, flush_every=2)
    tracks = defaultdict(list)
    for e in slices(obj):
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    assert len(tracks) == S + 1  # one per stage, and the optimizer's iteration track
    for spans in tracks.values():
        spans.sort()
        for (_a0, a1), (b0, _) in zip(spans, spans[1:]):
            assert b0 >= a1 - 1e-9
    acts = [e for e in slices(obj) if e["cat"] in ("F", "B")]
    assert len(acts) == len(tl["end"])
    by_it = defaultdict(list)
    for e in acts:
        by_it[e["args"]["iteration"]].append((e["ts"], e["ts"] + e["dur"]))
    for it in ITS:  # model clock: iteration t starts at the pipeline time before it (1 tau = 1 us)
        assert min(a for a, _ in by_it[it]) >= (it - 1) * per_call - 1e-9
        assert max(b for _, b in by_it[it]) <= it * per_call + 1e-9
    ends = [max(b for _, b in by_it[it]) for it in ITS]
    starts = [min(a for a, _ in by_it[it]) for it in ITS]
    assert all(s1 >= e0 for e0, s1 in zip(ends, starts[1:]))
    assert obj["otherData"]["time_unit"].startswith("1 us = 1 tau")


def test_tracks_are_named_by_rank_and_stage_and_steps_and_flushes_are_marked():
    tl, table, _ = model_timeline()
    obj = chrome_trace(tl, "model", table=table, flush_every=2)
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in obj["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    for s in range(S):
        assert names[(s, s)] == f"rank {s} · stage {s}"
    inst = [e for e in obj["traceEvents"] if e["ph"] == "i"]
    assert [e["name"] for e in inst if e["name"].startswith("step")] == [f"step {i}" for i in ITS]
    assert [e["args"]["iteration"] for e in inst if e["name"].startswith("flush")] == [2]
    its = [e for e in slices(obj) if e["cat"] == "iteration"]
    assert [e["name"] for e in its] == [f"iteration {i}" for i in ITS]


def test_one_flow_arrow_per_message_from_send_to_receive():
    tl, table, _ = model_timeline()
    obj = chrome_trace(tl, "model", table=table)
    starts = {(e["pid"], e["tid"], e["cat"], e["ts"]): e for e in slices(obj)}
    s_ev = {e["id"]: e for e in obj["traceEvents"] if e["ph"] == "s"}
    f_ev = {e["id"]: e for e in obj["traceEvents"] if e["ph"] == "f"}
    assert set(s_ev) == set(f_ev)
    assert len(s_ev) == len(ITS) * N * 2 * (S - 1)  # activations forward, gradients backward
    for i, a in s_ev.items():
        b = f_ev[i]
        src = starts[(a["pid"], a["tid"], a["cat"], a["ts"])]
        dst = starts[(b["pid"], b["tid"], b["cat"], b["ts"])]
        assert src["args"]["item"] == dst["args"]["item"]
        assert src["args"]["iteration"] == dst["args"]["iteration"]
        step = 1 if a["cat"] == "F" else -1
        assert dst["tid"] == src["tid"] + step
        assert dst["ts"] + dst["dur"] > src["ts"] + src["dur"] - 1e-9  # received after sent


def test_wall_clock_keeps_its_times_and_a_restarted_clock_follows_on():
    tl, _, _ = model_timeline()
    wall = {k: v.copy() for k, v in tl.items()}
    for i, it in enumerate(ITS[:2]):  # two iterations on one time line from the engine start
        m = wall["iteration"] == it
        for k in ("wait", "start", "end"):
            wall[k][m] = (tl[k][m] + 100.0 * i) * 1e-6
    obj = chrome_trace(wall, "wall", iterations=list(ITS[:2]))
    acts = [e for e in slices(obj) if e["cat"] in ("F", "B")]
    assert min(e["ts"] for e in acts) == pytest.approx(0.0)
    assert max(e["ts"] for e in acts if e["args"]["iteration"] == 2) > 100.0
    restarted = {k: v * (1e-6 if k in ("wait", "start", "end") else 1) for k, v in tl.items()}
    obj = chrome_trace(restarted, "wall")  # each call's clock from 0, as after a resume
    by_it = defaultdict(list)
    for e in slices(obj):
        if e["cat"] in ("F", "B"):
            by_it[e["args"]["iteration"]].append((e["ts"], e["ts"] + e["dur"]))
    for a, b in zip(ITS, ITS[1:]):
        assert min(x for x, _ in by_it[b]) >= max(y for _, y in by_it[a]) - 1e-9


@pytest.mark.parametrize("items,labelled", [(6, True), (50, False)])
def test_gantt_labels_only_what_fits_and_has_a_legend_and_the_bubble(items, labelled):
    import matplotlib.pyplot as plt

    sim = simulate_uniform("gpipe", 4, items, 1.0, 1.0, 0.0, record=True)
    fig = gantt_figure(gantt_rows(sim), "gpipe", "tau")
    ax = fig.axes[0]
    fig.canvas.draw()
    texts = ax.texts
    assert bool(texts) == labelled
    renderer = fig.canvas.get_renderer()
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    for t in texts:  # every label lies inside a bar
        box = t.get_window_extent(renderer)
        assert any(b.x0 <= box.x0 and box.x1 <= b.x1 for b in bars), t.get_text()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["F: forward", "B: backward"]
    assert f"bubble fraction {sim.bubble_fraction:.3f}" in ax.get_title()
    assert ax.get_xlabel() == "time (tau)"
    w, h = fig.get_size_inches()
    assert w >= 7 and (items < 50 or w > 9) and h >= 2.6
    plt.close(fig)


@pytest.mark.parametrize("name", ["zb-v", "interleaved-1f1b", "zb-h1"])
def test_placed_schedules_draw_every_action_on_its_rank_and_flow_only_between_ranks(name):
    from hpcpipe.pipeline import schedules
    from hpcpipe.pipeline.simulator import simulate

    P, n = 4, 4
    sch = schedules.build(name, P, n)
    St = sch.n_stages
    res = simulate(sch, [1.0] * St, [2.0] * St, np.full((St - 1, 1), 0.25), record=True)
    cols = defaultdict(list)
    for r, placed in enumerate(sch.order):
        st = schedules.stages_of(placed, n)
        codes = schedules.codes_of(placed, n)
        for p in range(len(placed)):
            for k, v in zip(
                ("iteration", "rank", "stage", "kind", "item", "wait", "start", "end"),
                (
                    1,
                    r,
                    st[p],
                    schedules.kinds(codes[p]),
                    schedules.items(codes[p]),
                    res.waits[r][p],
                    res.readys[r][p],
                    res.ends[r][p],
                ),
            ):
                cols[k].append(v)
    tl = {
        k: np.array(v, dtype=float if k in ("wait", "start", "end") else np.int64)
        for k, v in cols.items()
    }
    obj = chrome_trace(tl, "model")
    acts = [e for e in slices(obj) if e["cat"] in ("F", "B", "I", "W")]
    assert len(acts) == len(sch)
    assert all(e["pid"] == sch.placement[e["tid"]] for e in acts)  # each on its rank's track
    flows = [e for e in obj["traceEvents"] if e["ph"] == "s"]
    cross = int(np.sum(~schedules.local_hops(sch)))  # links between two ranks
    assert len(flows) == 2 * n * cross  # an activation and a gradient per item and link
    f_ev = {e["id"]: e for e in obj["traceEvents"] if e["ph"] == "f"}
    assert all(f_ev[e["id"]]["pid"] != e["pid"] for e in flows)
