"""``profkit rules``: the rule catalogue — codes, names, what each detects, and why."""
from __future__ import annotations

import json
from typing import Optional

import click

from profkit.cli.common import one_line_errors


def _row(mod) -> dict:
    m = mod.RULE
    return {"code": m.code, "name": m.name, "summary": m.summary, "example": m.example,
            "quiet_on": m.quiet_on, "tables": [t.value for t in m.tables],
            "params": {p.name: p.default for p in m.params}}


@click.command("rules")
@click.option("--explain", "explain", metavar="CODE", default=None,
              help="Print one rule's reasoning: what, why, evidence, fix, expected gain, references.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@one_line_errors
def rules(explain: Optional[str], as_json: bool) -> None:
    """List the rules that turn a trace into advice (code, name, one line, a trace that fires it)."""
    from profkit.judge import rules as catalogue  # here: `import profkit.cli` stays light
    if explain:
        mod = catalogue.get(explain)
        if as_json:
            click.echo(json.dumps({**_row(mod), "explanation": catalogue.explain(explain)}, indent=2))
        else:
            click.echo(f"{mod.RULE.code} {mod.RULE.name}\n")
            click.echo(catalogue.explain(explain), nl=False)
        return
    rows = [_row(m) for m in catalogue.RULES]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        click.echo(f"{r['code']}  {r['name']:<{width}}  {r['summary']}")
        click.echo(f"{'':6}  {'':<{width}}  e.g. {r['example']}")
