"""``firstsight``: how profkit judged a program the first time it saw it.

profkit is used on programs nobody here wrote, the first time it sees them, so that is how it is
judged too. The registry's first-sight programs (``programs_firstsight_*.py``: kinds the corpus
lacked, written without looking at the rules) are each scored once, by ``whatif_accuracy.py
firstsight``, with profkit as it stands when the program's first capture and its timed fixes are
committed: per pair the price (at the timed baseline, as the page prices every pair), the
measured gain and the error; per program the top action, whether it is the measured best (or
within 5% of it), whether its fix's step time lies within ±15%, and whether it promised 1.10x
where every fix measured under 1.05x. The record names the commit it was scored at and goes to
``analyses/data/whatif/first_sight.json.xz`` (``xz -dc`` reads it), and is never rewritten: a change of profkit that a
miss leads to is scored beside it on the page (today's score), never instead. The command
refuses to score from a working tree whose profkit/ or scripts/whatif/ differ from the commit.

Targets at first sight (over the programs scored): the top action the measured best on 80% or
more, its step time within ±15% on 80% or more, and no action of 1.10x or more where every fix
measured under 1.05x.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import subprocess
import sys

from . import registry
from .store import ROOT, read_data, read_measured, write_data

FIRST_NAME = "analyses/data/whatif/first_sight.json.xz"
FIRST = ROOT / FIRST_NAME
BAND = 0.15
TOP_TARGET = STEP_TARGET = 0.80


def registered() -> list[dict]:
    """The registry's first-sight programs, in its order."""
    return [p for p in registry.PROGRAMS if p.get("first_sight")]


def load_record() -> dict:
    return read_data(FIRST) if FIRST.exists() else {"programs": {}}


def judged(prog: dict, pairs: list[dict]) -> dict:
    """One program's first-sight verdict from its page rows (pricing.page_rows): the top action,
    its fix's measured gain and error, and the three target checks."""
    top, best = prog["top"], prog["best"]
    ok, got = prog["top_ok"]
    from .pricing import rule_name
    same = [r for r in pairs if top and r["rule"] != "-"
            and top["rule"] in map(rule_name, r["rule"].split("+"))]
    mine = max(same, key=lambda r: r["measured"]) if same else None
    nothing_pays = best is not None and best["measured"] < 1.05
    return {
        "top": ({"code": top.get("code"), "rule": top["rule"],
                 "predicted": round(top["expected_end_to_end_speedup"], 3)} if top else None),
        "best": {"fix": best["fix"], "measured": round(best["measured"], 3)} if best else None,
        "top_right": bool(ok), "top_fix_measured": got,
        # where nothing pays, the right answer is no promise: its step time is the baseline's
        "top_step_within": (bool(ok) if nothing_pays else
                            mine is not None and abs(mine["error"]) <= BAND),
        "false_promise": bool(nothing_pays and top and top["expected_end_to_end_speedup"] >= 1.10),
        "pairs": [{"fix": r["fix"], "rule": r["rule"], "predicted": round(r["predicted"], 3),
                   "measured": round(r["measured"], 3), "error": round(r["error"], 4),
                   "runs": r["runs"], "interleaved": r["interleaved"]} for r in pairs],
    }


def rows_of(measured: dict, names: set[str], load=None) -> dict[str, dict]:
    """Today's verdict (``judged``) of each named program that has a trace and timed fixes."""
    from .pricing import page_rows
    pairs, progs = page_rows(measured, load, only=names)
    return {p["program"]: judged(p, [r for r in pairs if r["program"] == p["program"]]) for p in progs}


def totals(verdicts: list[dict]) -> dict:
    """The first-sight targets over a set of program verdicts."""
    n = len(verdicts)
    return {"programs": n, "pairs": sum(len(v["pairs"]) for v in verdicts),
            "pairs_within": sum(abs(p["error"]) <= BAND for v in verdicts for p in v["pairs"]),
            "top_right": sum(v["top_right"] for v in verdicts),
            "top_step_within": sum(v["top_step_within"] for v in verdicts),
            "false_promises": sum(v["false_promise"] for v in verdicts)}


def _commit() -> str:
    """HEAD, refusing a working tree whose profkit/ or scripts/whatif/ differ from it: the record
    names the code that made it."""
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "profkit", "scripts/whatif"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if dirty:
        raise SystemExit("whatif_accuracy: firstsight scores the committed code: commit profkit/ and "
                         "scripts/whatif/ first:\n" + dirty)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()


def cmd_firstsight(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    record = load_record()
    measured = read_measured()
    names = {p["name"] for p in registered()}
    if args.programs:
        want = {n.strip() for n in args.programs.split(",") if n.strip()}
        if want - names:
            raise SystemExit(f"whatif_accuracy: not first-sight programs: {', '.join(sorted(want - names))}")
        names = want
    done = names & set(record["programs"])
    todo = names - done
    for n in sorted(done):
        print(f"{n}: scored at {record['programs'][n]['commit'][:10]} already: first sight happens once")
    if not todo:
        return
    commit = _commit()
    got = rows_of(measured, todo)
    for n in sorted(todo - set(got)):
        print(f"{n}: no committed trace or timed fix yet: not scored")
    today = _dt.date.today().isoformat()
    for n, verdict in got.items():
        record["programs"][n] = {"commit": commit, "scored_on": today, **verdict}
        print(f"{n}: top {verdict['top']['rule'] if verdict['top'] else 'none'}, "
              f"{'right' if verdict['top_right'] else 'wrong'}; "
              f"{sum(abs(p['error']) <= BAND for p in verdict['pairs'])} of {len(verdict['pairs'])} pairs "
              "within ±15%")
    if got:
        FIRST.parent.mkdir(parents=True, exist_ok=True)
        write_data(FIRST, record)


def section(today: dict[str, dict]) -> list[str]:
    """The page's first-sight section: the committed record of each scored program, today's
    score beside it, and the registered programs not scored yet."""
    record = load_record()["programs"]
    regs = registered()
    scored = [p["name"] for p in regs if p["name"] in record]
    lines = ["", "## First sight: programs profkit had not seen", "",
             f"{len(regs)} programs of kinds the corpus lacked (`scripts/whatif/programs_firstsight_*.py`) are "
             "judged the way profkit is used: each scored once, with profkit as it stood at the commit its first "
             "capture and timed fixes were scored at (`python3 scripts/whatif_accuracy.py firstsight`, "
             f"`{FIRST_NAME}`), never rescored in place; today's score stands beside it. Targets: "
             "the top action the measured best (or within 5%) on 80% of programs, its step time within ±15% "
             "on 80%, no action of 1.10x or more where every fix measured under 1.05x.", ""]
    if scored:
        first = totals([record[n] for n in scored])
        now = totals([today[n] for n in scored if n in today])
        lines += [f"- at first sight: {first['programs']} programs; top action right on **{first['top_right']} of "
                  f"{first['programs']}**, its step time within ±15% on **{first['top_step_within']} of "
                  f"{first['programs']}**; {first['pairs_within']} of {first['pairs']} pairs within ±15%; "
                  f"false promises: **{first['false_promises']}**",
                  f"- today: top action right on {now['top_right']} of {now['programs']}, its step time within "
                  f"±15% on {now['top_step_within']}; {now['pairs_within']} of {now['pairs']} pairs within ±15%; "
                  f"false promises: {now['false_promises']}", "",
                  "| program | kind | scored at | top action | measured best | top right | its step ±15% | pairs "
                  "within ±15% | false promise | today: top right | today: pairs within |",
                  "| --- | --- | --- | --- | --- | --- | --- | ---: | --- | --- | ---: |"]
        kinds = {p["name"]: p.get("family", p["kind"]) for p in regs}
        for n in scored:
            r, t = record[n], today.get(n)
            top = f"{r['top']['rule']} {r['top']['predicted']:.2f}x" if r["top"] else "none"
            best = f"{r['best']['fix']} {r['best']['measured']:.2f}x" if r["best"] else "-"
            within = f"{sum(abs(p['error']) <= BAND for p in r['pairs'])} of {len(r['pairs'])}"
            now_within = (f"{sum(abs(p['error']) <= BAND for p in t['pairs'])} of {len(t['pairs'])}"
                          if t else "-")
            lines.append(f"| {n} | {kinds[n]} | {r['commit'][:10]} ({r['scored_on']}) | {top} | {best} | "
                         f"{'yes' if r['top_right'] else 'no'} | {'yes' if r['top_step_within'] else 'no'} | "
                         f"{within} | {'yes' if r['false_promise'] else 'no'} | "
                         f"{('yes' if t['top_right'] else 'no') if t else '-'} | {now_within} |")
    # what was learnt about a record after it was scored (a timing found not to time the program):
    # said beside it, the score left as it was
    noted = [n for n in scored if record[n].get("note")]
    if noted:
        lines += [""] + [f"- {n}, after its first sight: {record[n]['note']}" for n in noted]
    unseen = [n for n in scored if n not in today]
    if unseen:
        lines += ["", f"Scored at first sight, their capture not committed (the tree's size bound), so no score "
                      f"today: {', '.join(unseen)}."]
    waiting = [p for p in regs if p["name"] not in record]
    if waiting:
        names = ", ".join(f"{p['name']} ({p.get('family', p['kind'])})" for p in waiting)
        lines += [""] * (lines[-1] != "") + [
            f"Registered, not scored yet (no committed capture with timed fixes): {len(waiting)} — {names}."]
    return lines
