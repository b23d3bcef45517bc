"""`hpcpipe analyze` on a user's own sweep: a table of every point (grid values, status,
iterations, time to eps, final gap) and loss figures per grid key."""

import re

from hpcpipe.cli.main import main

SWEEP = """
[sweep]
name = "mine"
out = "{out}"
ranks = 1

[base]
problem = "l1-chain"
depth = 2
dim = 8
optimizer = "gd"
iterations = 30
epsilon = 0.05
progress = "off"

[grid]
lr = [0.02, 0.2]
seed = [0, 1]
"""


def test_analyze_tables_and_draws_a_users_own_sweep(tmp_path, capsys):
    res = tmp_path / "res"
    sweep = tmp_path / "mine.toml"
    sweep.write_text(SWEEP.format(out=res))
    assert main(["sweep", str(sweep), "--np", "1"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(res), "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "1 study, 0 verdict rows" in out
    md = (tmp_path / "rep" / "report.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| file |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[:3] == ["file", "lr", "seed"] and "time to eps" in cols
    rows = [line for line in md.splitlines() if re.match(r"\| 000\d", line)]
    assert len(rows) == 4
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert sorted((float(c[1]), int(c[2])) for c in cells) == [
        (0.02, 0),
        (0.02, 1),
        (0.2, 0),
        (0.2, 1),
    ]
    assert all(c[3] == "complete" and c[4] == "30" for c in cells)
    for key in ("lr", "seed"):
        figs = list((tmp_path / "rep").glob(f"points-*-{key}.png"))
        assert len(figs) == 1 and figs[0].stat().st_size > 5000
    # --study selects the built-in studies only: the points are left out
    assert main(["analyze", str(res), "-o", str(tmp_path / "rep2"), "--study", "depth"]) == 2
