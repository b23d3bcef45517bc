"""Stages placed on ranks, split backward (I / W) and the schedules built on them."""

from pathlib import Path

import numpy as np
import pytest

from hpcpipe.pipeline import schedules as S
from hpcpipe.pipeline import simulator, summary, torch_csv, wavefront
from hpcpipe.pipeline.schedules import Schedule, ScheduleError

DATA = Path(__file__).parent / "data"
NEW = ["interleaved-1f1b", "looped-bfs", "zb-h1", "zb-v"]


def _sizes(name):
    for P in (1, 2, 4):
        for n in (1, 2, 3, 4, 8, 12):  # interleaved-1f1b: n < P, P | n, rounds of 3 on 2
            yield P, n


def _sim(sch, tf, ti, tw, c=0.0, method="auto"):
    St = sch.n_stages
    msg = np.full((max(St - 1, 0), 1), c)
    return simulator.simulate(
        sch, [tf] * St, [ti + tw] * St, msg, method=method, t_input=[ti] * St, t_weight=[tw] * St
    )


@pytest.mark.parametrize("name", NEW)
def test_new_builders_are_valid_complete_and_placed(name):
    for P, n in _sizes(name):
        sch = S.build(name, P, n).validate()
        assert sch.n_ranks == P
        per_item = 3 if name.startswith("zb") else 2
        assert len(sch) == per_item * sch.n_stages * n
        # each rank's list holds exactly the actions of its stages
        for r, acts in enumerate(sch.rank_actions):
            assert {a.stage for a in acts} == {s for s, q in enumerate(sch.placement) if q == r}


def test_placements():
    assert S.build("interleaved-1f1b", 4, 8).placement == (0, 1, 2, 3, 0, 1, 2, 3)
    assert S.build("zb-v", 4, 8).placement == (0, 1, 2, 3, 3, 2, 1, 0)
    assert S.interleaved_1f1b(2, 4, virtual=3).placement == (0, 1, 0, 1, 0, 1)
    with pytest.raises(ScheduleError, match=r"n_items \(9\) must be below the ranks \(4\) or a"):
        S.build("interleaved-1f1b", 4, 9)  # 2 rounds cannot split 9 items


def test_codes_are_one_encoding_and_round_trip():
    n = 5
    placed = S.place(3, S.encode(4, S.Kind.WEIGHT), n)
    assert S.stages_of(placed, n) == 3
    assert S.items(S.codes_of(placed, n)) == 4 and S.kinds(S.codes_of(placed, n)) == S.Kind.WEIGHT
    assert str(S.Action.parse("7W3")) == "7W3" and S.Action.parse("1I0").kind == "I"


def test_split_backward_dependency_rule():
    # I sends the gradient on like B; W waits for no message
    assert S.dependency(1, S.Kind.INPUT, 3) == (2, S.Kind.BACKWARD)
    assert S.dependency(1, S.Kind.WEIGHT, 3) is None
    assert S.consumer(1, S.Kind.INPUT, 3) == 0 and S.consumer(1, S.Kind.WEIGHT, 3) is None


def test_planted_weight_before_input_is_refused():
    lists = [["0F0", "0I0", "0W0"], ["1F0", "1W0", "1I0"]]
    with pytest.raises(ScheduleError, match="action 1W0 comes before its input gradient 1I0"):
        Schedule.from_lists("bad", 1, lists).validate()
    with pytest.raises(ScheduleError, match="missing action 1W0"):
        Schedule.from_lists("bad", 1, [["0F0", "0B0"], ["1F0", "1I0"]]).validate()
    with pytest.raises(ScheduleError, match="runs both 1B0 and 1I0"):
        Schedule.from_lists("bad", 1, [["0F0", "0B0"], ["1F0", "1I0", "1B0", "1W0"]]).validate()


def test_rank_lists_refuse_a_stage_on_two_ranks():
    with pytest.raises(ScheduleError, match="stage 0 is on rank 0"):
        Schedule.from_rank_lists("bad", 1, [["0F0"], ["0B0"]])


def test_deadlock_names_the_cycle_and_marks_the_grid():
    # rank 0 owns stages 0 and 3 (a V): it insists on 3F0 before 0F0, which feeds it
    lists = [["3F0", "0F0", "3B0", "0B0"], ["1F0", "2F0", "2B0", "1B0"]]
    sch = Schedule.from_rank_lists("v", 1, lists, placement=[0, 1, 1, 0])
    with pytest.raises(ScheduleError) as e:
        sch.validate()
    text = str(e.value)
    assert "rank 0 waits at 3F0 for 2F0" in text and "rank 1 waits at 1F0 for 0F0" in text
    assert "cycle: 3F0 -> 1F0 -> 3F0" in text
    assert "3F0*" in text and "1F0*" in text and "Rank 1" in text


@pytest.mark.parametrize("name", NEW)
def test_rounds_kernel_equals_the_walk_bitwise(name):
    g = np.random.default_rng(7)
    for P, n in [(1, 4), (2, 8), (4, 8), (4, 12)]:
        sch = S.build(name, P, n)
        St = sch.n_stages
        tf, tb, ti, tw = (g.uniform(0.5, 2, St) for _ in range(4))
        msg = g.uniform(0, 0.3, (St - 1, n))
        by = wavefront.rounds_by_kind(sch, tf, tb, msg, probe=10**9, ti=ti, tw=tw)
        ref = simulator.simulate(sch, tf, tb, msg, method="walk", t_input=ti, t_weight=tw)
        for k, e in enumerate(ref.by_kind):
            ran = ~np.isnan(e)
            assert np.array_equal(by[k][ran], e[ran])


def test_same_rank_hand_off_costs_no_message():
    # zb-v's turn (stages P-1 and P on rank P-1) is a local copy: its cost is ignored
    P, n = 4, 8
    sch = S.build("zb-v", P, n)
    St = sch.n_stages
    msg = np.zeros((St - 1, n))
    base = simulator.simulate(sch, [1.0] * St, [2.0] * St, msg).makespan
    msg[P - 1] = 1e6  # the boundary between stages 3 and 4
    assert simulator.simulate(sch, [1.0] * St, [2.0] * St, msg).makespan == base
    msg[P - 2] = 1.0  # a real hop: it does cost
    assert simulator.simulate(sch, [1.0] * St, [2.0] * St, msg).makespan > base


def test_interleaved_closed_form_with_messages():
    g = np.random.default_rng(11)
    for v in (1, 2, 3):
        for P, n in [(1, 3), (2, 4), (2, 8), (3, 9), (4, 8), (4, 16)]:
            sch = S.interleaved_1f1b(P, n, v)
            for _ in range(4):
                tf, tb = g.uniform(0.1, 2, 2)
                c = float(g.uniform(0, 1) * min(tf, tb))
                got = _sim(sch, tf, tb / 2, tb / 2, c).makespan
                want = S.interleaved_1f1b_time(P, n, tf, tb, c, virtual=v)
                assert got == pytest.approx(want, rel=1e-12, abs=0)


def _torch_interleaved(P, n, v):
    """Rank lists by torch's relaxed rule (``ScheduleInterleaved1F1B``: rounds of
    g = n // max(1, n // P) items, warm-up (v − 1)g + 2(P − 1 − r) capped at vn, one
    item counter per stage), written independently of the builder's formulas."""
    g = n // max(1, n // P)
    lists = []
    for r in range(P):
        warm = min((v - 1) * g + 2 * (P - 1 - r), v * n)
        # (kind, its step): warm-up F's, then F, B pairs, then the remaining B's
        steps = [("F", k) for k in range(warm)]
        for j in range(v * n - warm):
            steps += [("F", warm + j), ("B", j)]
        steps += [("B", j) for j in range(v * n - warm, v * n)]
        count: dict = {}
        acts = []
        for kind, k in steps:
            local = (k // g) % v if kind == "F" else v - 1 - (k // g) % v
            st = local * P + r
            count[st, kind] = count.get((st, kind), -1) + 1  # one item counter per stage
            acts.append(f"{st}{kind}{count[st, kind]}")
        lists.append(acts)
    return lists


@pytest.mark.parametrize(("P", "n"), [(4, 1), (4, 3), (4, 6), (4, 10), (3, 8), (3, 4), (4, 8)])
def test_interleaved_lists_follow_torchs_rounds_for_any_item_count(P, n):
    for v in (2, 3):
        sch = S.interleaved_1f1b(P, n, v).validate()
        got = [[str(a) for a in acts] for acts in sch.rank_actions]
        assert got == _torch_interleaved(P, n, v)


def test_interleaved_closed_form_for_item_counts_not_a_multiple_of_the_ranks():
    """n < P is GPipe's fill-drain on vP stages; rounds of g != P items keep the
    (vn + P − 1) bubble with c = 0; with messages the form is claimed for n < P only."""
    g = np.random.default_rng(13)
    for v in (1, 2, 3):
        for P, n in [(4, 1), (4, 3), (6, 5), (8, 2), (2, 3), (4, 6), (4, 10), (3, 8), (5, 24)]:
            sch = S.interleaved_1f1b(P, n, v)
            for _ in range(4):
                tf, tb = g.uniform(0.1, 2, 2)
                c = float(g.uniform(0, 1) * min(tf, tb)) if n < P else 0.0
                got = _sim(sch, tf, tb / 2, tb / 2, c).makespan
                want = S.interleaved_1f1b_time(P, n, tf, tb, c, virtual=v)
                assert got == pytest.approx(want, rel=1e-12, abs=0)
    with pytest.raises(S.OutsideRegime, match="message term"):
        S.interleaved_1f1b_time(4, 6, 1.0, 2.0, 0.5)  # rounds of 6 with messages: not claimed
    assert S.interleaved_1f1b_time(4, 1, 1.0, 2.0) == (2 * 4 + 1 - 1) * 3.0  # GPipe on 8 stages


def test_looped_bfs_closed_form_in_its_regime():
    g = np.random.default_rng(12)
    checked = 0
    for v in (1, 2, 3):
        for P, n in [(1, 3), (2, 8), (3, 9), (4, 8), (4, 16), (5, 6)]:
            sch = S.looped_bfs(P, n, v)
            for _ in range(6):
                tf, tb = g.uniform(0.1, 2, 2)
                c = float(g.uniform(0, 1) * min(tf, tb))
                try:
                    want = S.looped_bfs_time(P, n, tf, tb, c, virtual=v)
                except S.OutsideRegime:
                    continue
                checked += 1
                assert _sim(sch, tf, tb / 2, tb / 2, c).makespan == pytest.approx(want, rel=1e-12)
    assert checked > 30


def test_zb_h1_closed_form_and_the_paper_notation():
    g = np.random.default_rng(13)
    checked = 0
    for P, n in [(1, 1), (1, 5), (2, 8), (3, 9), (4, 4), (4, 7), (4, 16), (6, 6)]:
        sch = S.zb_h1(P, n)
        for _ in range(12):
            tf, ti, tw = g.uniform(0.1, 2, 3)
            if tw > min(tf, ti):
                with pytest.raises(S.OutsideRegime):
                    S.zb_h1_time(P, n, tf, ti + tw, t_i=ti, t_w=tw)
                continue
            checked += 1
            want = S.zb_h1_time(P, n, tf, ti + tw, t_i=ti, t_w=tw)
            got = _sim(sch, tf, ti, tw).makespan
            assert got == pytest.approx(want, rel=1e-12)
            if P > 1:  # the paper's T_B is our t_I: reading it as the full backward is wrong
                wrong = n * (tf + ti + tw) + (P - 1) * (tf + (ti + tw) - tw)
                assert got != pytest.approx(wrong, rel=1e-6)
    assert checked > 20


def test_closed_forms_for_fewer_items_than_ranks():
    """n <= P (GD's one item, PPRS's K on a deep pipeline): looped-bfs (with messages),
    zb-h1 and zb-v equal the exact simulator on random costs in their regimes."""
    g = np.random.default_rng(21)
    for P in range(1, 9):
        for n in range(1, P + 1):
            for v in (1, 2, 3):
                tf, tb = g.uniform(0.1, 2, 2)
                c = float(g.uniform(0, 2))
                want = S.looped_bfs_time(P, n, tf, tb, c, virtual=v)
                assert _sim(S.looped_bfs(P, n, v), tf, tb / 2, tb / 2, c).makespan == (
                    pytest.approx(want, rel=1e-12)
                )
            tf, ti = g.uniform(0.1, 2, 2)
            tw = float(g.uniform(0.05, min(tf, ti)))
            want = S.zb_h1_time(P, n, tf, ti + tw, t_i=ti, t_w=tw)
            assert _sim(S.zb_h1(P, n), tf, ti, tw).makespan == pytest.approx(want, rel=1e-12)
            t = float(g.uniform(0.1, 2))
            want = S.zb_v_time(P, n, t, 2 * t, t_i=t, t_w=t)
            assert _sim(S.zb_v(P, n), t, t, t).makespan == pytest.approx(want, rel=1e-12)
    # between zb-v's two regimes no formula is claimed
    with pytest.raises(S.OutsideRegime, match="n <= P or n >= 2P - 1"):
        S.zb_v_time(4, 6, 1.0, 2.0, t_i=1.0, t_w=1.0)


def test_zb_h1_beats_1f1b_by_twice_the_weight_time():
    P, n, tf, ti, tw = 4, 8, 1.0, 1.0, 1.0
    zb = _sim(S.zb_h1(P, n), tf, ti, tw).makespan
    ofob = _sim(S.one_f_one_b(P, n), tf, ti, tw).makespan
    assert ofob - zb == 2 * (P - 1) * tw


def test_zb_v_closed_form_equal_costs():
    for P, n in [(1, 1), (2, 3), (2, 8), (3, 5), (4, 7), (4, 12)]:
        for t in (1.0, 0.375):
            want = S.zb_v_time(P, n, t, 2 * t, t_i=t, t_w=t)
            assert _sim(S.zb_v(P, n), t, t, t).makespan == want
    with pytest.raises(S.OutsideRegime):
        S.zb_v_time(4, 8, 1.0, 2.0, t_i=0.5, t_w=1.5)


def test_peak_stash_per_rank():
    assert S.peak_stash(S.zb_h1(4, 8)) == [4, 4, 4, 4]  # 1F1B's first-stage peak on every rank
    assert S.peak_stash(S.one_f_one_b(4, 8)) == [4, 3, 2, 1]
    assert S.peak_stash(S.gpipe(4, 8)) == [8] * 4
    assert S.peak_stash(S.looped_bfs(4, 8, 2)) == [16] * 4
    assert S.peak_stash(S.interleaved_1f1b(4, 8, 2)) == [11, 9, 7, 5]
    assert S.peak_stash(S.zb_h1(2, 4), item_bytes=[10.0, 1.0]) == [20.0, 2.0]
    res = _sim(S.zb_v(4, 8), 1.0, 1.0, 1.0)
    assert res.peak_stash() == [8, 8, 8, 8]


def test_summary_prints_grid_makespan_bubble_memory():
    text = summary.summary(S.build("zb-h1", 4, 8).validate(), 1.0, 2.0)
    assert "Step 00: 0F0" in text and "Rank 3" in text
    assert "makespan: 27 (closed form 27)" in text
    assert "bubble fraction: 0.1111" in text  # 1 - 4·24/(4·27)
    assert "peak stashed activations per rank (items): 4 4 4 4" in text


@pytest.mark.parametrize(
    ("fname", "name"),
    [
        ("torch_zbv_4x8.csv", "zb-v"),
        ("torch_zbh1_4x8.csv", "zb-h1"),
        ("torch_interleaved_4x8.csv", "interleaved-1f1b"),
    ],
)
def test_torch_csv_reads_torch_dump_and_round_trips(tmp_path, fname, name):
    sch = torch_csv.read_csv(DATA / fname).validate()
    ours = S.build(name, 4, 8)
    assert sch.placement == ours.placement
    assert all(np.array_equal(a, b) for a, b in zip(sch.order, ours.order))
    out = tmp_path / "back.csv"
    torch_csv.write_csv(sch, out)
    again = torch_csv.read_csv(out)
    assert all(np.array_equal(a, b) for a, b in zip(again.order, sch.order))
    assert _sim(again, 1.0, 1.0, 1.0).makespan == _sim(ours, 1.0, 1.0, 1.0).makespan


def test_torch_csv_refuses_comms_actions(tmp_path):
    p = tmp_path / "comms.csv"
    p.write_text("0F0,0SEND_F0,0B0\n")
    with pytest.raises(ScheduleError, match="compute-only format"):
        torch_csv.read_csv(p)


@pytest.mark.parametrize("name", NEW)
def test_lists_equal_torch_live(name):
    pytest.importorskip("torch")
    from tests import peer_torch  # noqa: PLC0415

    for P, n in [(1, 2), (2, 4), (4, 8), (4, 12), (3, 6)]:
        if name == "zb-v" and n < 1:
            continue
        ours = [[str(a) for a in acts] for acts in S.build(name, P, n).rank_actions]
        assert ours == peer_torch.pipeline_order(name, P, n), (P, n)


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "hpcpipe", "schedule", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "makespan", "peak"),
    [
        (["zb-h1"], "27 (closed form 27)", "4 4 4 4"),
        (["interleaved-1f1b", "--virtual", "2"], "57 (closed form 57)", "11 9 7 5"),
        (["zb-v"], "51 (closed form 51)", "8 8 8 8"),
    ],
)
def test_schedule_command_prints_grid_makespan_bubble_memory(args, makespan, peak):
    p = _cli(*args, "--ranks", "4", "--items", "8")
    assert p.returncode == 0, p.stderr
    assert "Step 00:" in p.stdout and "Rank 3" in p.stdout
    assert f"makespan: {makespan}" in p.stdout and "bubble fraction:" in p.stdout
    assert f"peak stashed activations per rank (items): {peak}" in p.stdout


def test_schedule_command_bad_input_and_deadlock(tmp_path):
    p = _cli("interleaved-1f1b", "--ranks", "4", "--items", "9")
    assert p.returncode == 2 and "must be below the ranks (4) or a multiple of" in p.stderr
    assert "Traceback" not in p.stderr
    dead = tmp_path / "dead.csv"
    dead.write_text("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n")
    p = _cli("--from-csv", str(dead))
    assert p.returncode == 2 and "cycle: 0B0 -> 1F1 -> 0B0" in p.stderr
    assert "0B0*" in p.stderr and "1F1*" in p.stderr
    out = tmp_path / "zb.csv"
    out.write_text("keep")
    p = _cli("zb-h1", "--write-csv", str(out))
    assert p.returncode == 2 and out.read_text() == "keep"  # never overwritten
    new = tmp_path / "zb2.csv"
    assert _cli("zb-h1", "--ranks", "2", "--items", "4", "--write-csv", str(new)).returncode == 0
    assert new.read_text().splitlines()[0].startswith("0F0,0F1,0I0,0W0,0F2")


def test_run_config_accepts_placed_schedules_on_the_engine_and_refuses_bad_item_counts():
    from hpcpipe.errors import ConfigError
    from hpcpipe.run.config import make_config, validate

    base = dict(problem="max-chain", depth=8, iterations=2, eval_every=0, output="")
    four = {**base, "optimizer": "pprs", "samples": 4}  # interleaved: items in groups of 4
    for name in ("interleaved-1f1b", "looped-bfs", "zb-v"):  # several stages per rank
        validate(make_config({**four, "schedule": name}), n_ranks=4)
    with pytest.raises(ConfigError, match="makes 16 stages of 8 ranks and depth = 8"):
        validate(make_config({**base, "schedule": "zb-v"}), n_ranks=8)
    cfg = {**base, "schedule": "interleaved-1f1b", "executor": "simulated", "stages": 4}
    cfg = {**cfg, "clock": "model", "optimizer": "pprs"}
    validate(make_config({**cfg, "samples": 3}))  # fewer items than ranks: one round
    with pytest.raises(ConfigError, match="must be below the ranks"):
        validate(make_config({**cfg, "samples": 9}))  # 2 rounds cannot split 9 items
    with pytest.raises(ConfigError, match="makes 16 stages of 8 ranks and depth = 8"):
        zbv = {**base, "schedule": "zb-v", "executor": "simulated", "clock": "model"}
        validate(make_config(zbv))
    validate(make_config({**base, "schedule": "zb-h1"}), n_ranks=4)  # one stage per rank: fine
