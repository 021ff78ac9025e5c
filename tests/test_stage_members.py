"""``ensio stage --members LIST`` (issue 25, item 8): a selection of members, staged as
``ensio analyse --members LIST`` reads it.

The option is the one ``ensio analyse`` takes (``cli/options.py``): the selection
becomes ``ensemble.ids``/``ensemble.size``, so file f = m·P + p numbers member m
within the selection, and rank f holds it. Expected paths come from that rule,
spelt out here, not from the code under test.
"""

from __future__ import annotations

import json

from stage_support import ensio, make_case, make_dirs, sha, tree

HOST = "nodeA"


def _config(case, path) -> None:
    path.write_text(json.dumps({
        "ensemble": {"members": "glob/mem{member:03d}_{tile:04d}.nc", "size": case.n_e,
                     "variables": ["x"], "tiles": {"count": case.n_tiles, "layout": [2, 1]}},
        "io": {"local_dir": "local/{host}/r{rank:02d}"}}))  # fmt: skip


def _local(case, rank: int, member: int, tile: int):
    return case.root / "local" / HOST / f"r{rank:02d}" / case.files[member, tile].name


def test_stage_in_and_out_a_selection(tmp_path, rng) -> None:
    case = make_case(tmp_path, rng, n_e=3, n_tiles=2)
    cfg = tmp_path / "ensio.yaml"
    _config(case, cfg)
    make_dirs(case.local_dirs(4, [HOST] * 4))
    env = {"ENSIO_HOST": HOST}
    run = ensio("stage", "in", str(cfg), "--members", "1,3", env_extra=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("stage in: 4 files on 1 node(s): 4 copied")
    # member 3 is the selection's second member: its tiles are files 2 and 3
    want = {(0, 1, 0), (1, 1, 1), (2, 3, 0), (3, 3, 1)}
    for rank, member, tile in want:
        assert sha(_local(case, rank, member, tile)) == sha(case.files[member, tile])
    staged = {p.name for p in (tmp_path / "local").rglob("*.nc")}
    assert staged == {case.files[m, t].name for _, m, t in want}  # member 2 stays global

    new = _local(case, 2, 3, 0)
    new.write_bytes(b"analysis of member 3, tile 0")
    whole = ensio("stage", "out", str(cfg), env_extra=env)  # member 2 was never staged
    assert whole.returncode == 2 and "member 2 tile 0" in whole.stderr, whole.stderr
    untouched = {k: sha(p) for k, p in case.files.items() if k != (3, 0)}
    out = ensio("stage", "out", str(cfg), "--members", "1,3", env_extra=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stage out: 4 files on 1 node(s): 1 copied")
    assert case.files[3, 0].read_bytes() == b"analysis of member 3, tile 0"
    assert {k: sha(p) for k, p in case.files.items() if k != (3, 0)} == untouched


def test_a_member_outside_the_ensemble_is_one_line_naming_the_option(tmp_path, rng) -> None:
    case = make_case(tmp_path, rng, n_e=3, n_tiles=2)
    cfg = tmp_path / "ensio.yaml"
    _config(case, cfg)
    make_dirs(case.local_dirs(6, [HOST] * 6))
    before = tree(tmp_path)
    for bad, needle in (("0,2", "--members"), ("1,x", "--members")):
        run = ensio("stage", "in", str(cfg), "--members", bad, env_extra={"ENSIO_HOST": HOST})
        assert run.returncode == 2, run.stderr
        assert needle in run.stderr.strip().splitlines()[-1]
    assert tree(tmp_path) == before
