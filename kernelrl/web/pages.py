"""The run page's HTML, rendered on the server; every piece of text escaped.

A candidate's code, its answer, error output and finding messages are written by a model that
is paid to find holes: everything that reaches HTML goes through `html.escape` (quotes too),
links are built here from ids and percent-encoded task names (never taken from the database
as URLs), and the pages carry no inline script: `app.py` sends a Content-Security-Policy
that lets only the package's own script files run.

`run_display(view, links)` is the run page's content as plain data (cards, tables of cells,
texts, chart series): the first render turns it into HTML here, and the page's script
(`static/watch.js`) rebuilds the same tables from the JSON endpoint with `textContent`, so a
value is formatted once, in Python.

Does not compute numbers (`views.py` does) or read the database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypedDict
from urllib.parse import quote

from kernelrl.report.console import (
    ROOFLINE_LEGEND,
    interval_text,
    percent_text,
    roofline_text,
    speedup_text,
)
from kernelrl.report.metrics import (
    NOISE_LEGEND,
    compile_within_noise,
    geometric_mean,
    noise_marked,
    slower_beyond_noise,
)
from kernelrl.result import EvalResult, Status
from kernelrl.store.snapshot import CandidateDetail
from kernelrl.web.code import PageBudget, code_html, diff_html, esc, visible
from kernelrl.web.views import RunSummary, RunView, TaskLine, TaskView, unjudged_label

MAX_ERROR_CHARS = 6000  # the tail of compiler output shown per candidate
Cell = str | dict[str, str]


class Table(TypedDict):
    """A table as the page's script reads it: column names, rows of cells, the text shown when empty."""

    header: list[str]
    rows: list[list[Cell]]
    empty: str


@dataclass(frozen=True, kw_only=True)
class Links:
    """Where the pages live: `base` is the path the router is served under ('' at the root)."""

    base: str
    sign_out: str = ""  # a sign-out page's path, linked from every page when set

    def static(self, name: str) -> str:
        return f"{self.base}/static/{quote(name)}"

    def index(self) -> str:
        return f"{self.base}/"

    def run(self, run_id: int) -> str:
        return f"{self.base}/runs/{int(run_id)}"

    def run_api(self, run_id: int) -> str:
        return f"{self.base}/api/runs/{int(run_id)}"

    def runs_api(self) -> str:
        return f"{self.base}/api/runs"

    def task(self, run_id: int, task: str) -> str:
        return f"{self.base}/runs/{int(run_id)}/tasks/{quote(task, safe='/')}"

    def candidate(self, run_id: int | None, candidate_id: int) -> str:
        return f"{self.base}/runs/{int(run_id or 0)}/candidates/{int(candidate_id)}"


def when(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def number(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


# ------------------------------------------------------------------------------------ layout


def page(title: str, body: str, links: Links, *, script: bool = False, data: dict[str, str] | None = None) -> str:
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in (data or {}).items())
    scripts = ""
    if script:
        scripts = (f'<script src="{esc(links.static("uPlot.iife.min.js"))}"></script>'
                   f'<script src="{esc(links.static("watch.js"))}"></script>')
    out = f"<a class='out' href='{esc(links.sign_out)}'>sign out</a>" if links.sign_out else ""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><link rel='icon' href='data:,'>"
            f"<link rel='stylesheet' href='{esc(links.static('uPlot.min.css'))}'>"
            f"<link rel='stylesheet' href='{esc(links.static('watch.css'))}'>"
            f"</head><body{attrs}><nav><a href='{esc(links.index())}'>kernelrl watch</a>{out}</nav>"
            f"<main>{body}</main>{scripts}</body></html>")


def cell_html(cell: Cell, label: str = "") -> str:
    data = f' data-label="{esc(label)}"' if label else ""
    if isinstance(cell, str):
        return f"<td{data}>{esc(cell)}</td>"
    cls = f' class="{esc(cell["cls"])}"' if cell.get("cls") else ""
    text = esc(cell.get("text", ""))
    if cell.get("href"):
        text = f'<a href="{esc(cell["href"])}">{text}</a>'
    return f"<td{cls}{data}>{text}</td>"


def _chart(name: str) -> str:
    """A chart's place; until the script draws it (or when there is nothing to draw) it says so."""
    return f"<div class='chart empty' id='chart-{name}'>{esc(name)}: nothing to plot yet</div>"


def table_html(table_id: str, table: Table) -> str:
    """A table; on a phone each row stacks into lines labelled by the header (the page's script
    labels the rows it writes alike)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in table["header"])
    rows = "".join("<tr>" + "".join(cell_html(c, label) for c, label in zip(row, table["header"])) + "</tr>"
                   for row in table["rows"])
    empty = f"<p class='empty' id='{esc(table_id)}-empty'{' hidden' if table['rows'] else ''}>{esc(table['empty'])}</p>"
    return (f"<table id='{esc(table_id)}'{' hidden' if not table['rows'] else ''}><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>{empty}")


def _table(header: list[str], rows: list[list[Cell]], empty: str) -> Table:
    """A table as data; its texts with hidden controls shown (the page's script writes them as they are)."""
    shown = [[visible(c) if isinstance(c, str) else {**c, "text": visible(c.get("text", ""))} for c in row]
             for row in rows]
    return {"header": header, "rows": shown, "empty": empty}


# ------------------------------------------------------------------------------------ index


def runs_display(runs: list[RunSummary], links: Links) -> dict[str, Any]:
    rows: list[list[Cell]] = [[{"text": f"run {r.id}", "href": links.run(r.id)}, r.kind, r.proposer, r.status,
                               when(r.started), str(r.candidates)] for r in runs]
    return {"tables": {"runs": _table(["run", "kind", "proposer", "status", "started", "candidates"], rows,
                                      "No run in this database yet: this list fills in when one starts.")}}


def index_page(runs: list[RunSummary], links: Links, *, db_path: str, waiting: str | None = None) -> str:
    body = [f"<h1>Runs in {esc(db_path)}</h1>"]
    if waiting:
        body.append(f"<p class='note' id='waiting'>{esc(waiting)}</p>")
    body.append(table_html("runs", runs_display(runs, links)["tables"]["runs"]))
    return page("kernelrl watch", "".join(body), links, script=True,
                data={"page": "index", "api": links.runs_api(), "db": db_path})


# ------------------------------------------------------------------------------------ run page


def run_display(view: RunView, links: Links) -> dict[str, Any]:
    run, prog = view.run, view.progress
    solved = [t for t in view.tasks if t.speedup_vs_eager is not None]
    # the geomean's range: the geomean of the best candidates' 95 % interval ends (as the HTML report)
    lows = geometric_mean([t.interval[0] if t.interval else t.speedup_vs_eager or 1.0 for t in solved])
    highs = geometric_mean([t.interval[1] if t.interval else t.speedup_vs_eager or 1.0 for t in solved])
    span = f" ({lows:.2f}-{highs:.2f}x)" if lows is not None and highs is not None else ""
    cards = [("geomean of the tasks' best vs eager (range within their 95% intervals)",
              speedup_text(view.geomean_vs_eager) + span),
             ("median of the tasks' best vs eager", speedup_text(view.median_vs_eager)),
             ("geomean of the tasks' best vs torch.compile", speedup_text(view.geomean_vs_compile)),
             *[(f"fast_{p:g}", percent_text(v)) for p, v in view.fast_p],
             ("tasks solved", f"{view.solved}/{len(view.tasks)}")]
    total = "?" if prog.total is None else str(prog.total)
    rate = "-" if prog.rate_per_s is None else f"{prog.rate_per_s * 60:.1f} {prog.unit}/min"
    texts = {
        "status": f"run {run.id} ({run.kind}" + (f", {run.proposer}" if run.proposer != run.kind else "")
                  + f"): {run.status}",
        "progress": f"{prog.done}/{total} {prog.unit}",
        "eta": duration(prog.eta_s) if prog.eta_s is not None else "-",
        "elapsed": duration(prog.elapsed_s),
        "rate": rate,
        "idle": duration(prog.idle_s),
        "updated": when(view.now),
        "judge_rate": _judge_text(view),
    }
    tasks: list[list[Cell]] = [_task_row(t, run.id, links) for t in view.tasks]
    refused: list[list[Cell]] = [
        [{"text": h.task, "href": links.task(run.id, h.task)},
         {"text": f"#{h.candidate_id}", "href": links.candidate(run.id, h.candidate_id)},
         {"text": h.rule, "cls": "rule"}, first_line(h.message), when(h.created)] for h in view.recent_refused]
    display: dict[str, Any] = {
        "cards": [{"label": k, "value": v} for k, v in cards],
        "texts": texts,
        "progress": {"value": prog.done, "max": prog.total if prog.total is not None else 0},
        "running": run.status == "running",
        "tables": {
            "tasks": _table(["task", "level", "candidates", "correct / evaluated", "refused", "best vs eager",
                             "95% interval", "vs torch.compile", "% of roofline", "best"], tasks,
                            "No task yet."),
            "rules": _table(["rule", "refused candidates"], [[{"text": r, "cls": "rule"}, str(n)]
                                                             for r, n in view.refused_by_rule],
                            "No candidate refused."),
            "refused": _table(["task", "candidate", "rule", "why", "when"], refused, "No candidate refused."),
            "statuses": _table(["status", "candidates"], [[s, str(n)] for s, n in view.status_counts.items()],
                               "No candidate yet."),
            "judge": _table(["phase", "seconds", "share of the groups' time"],
                            [[name, f"{sec:.1f}", percent_text(share)] for name, sec, share in view.judge.split()]
                            if view.judge is not None else [], "Nothing judged yet."),
        },
        "charts": {"speedup": _speedup_chart(view)},
    }
    if view.training is not None:
        display["charts"].update(_training_charts(view))
        display["tables"]["steps"] = _table(
            ["step", "rollouts", "raw reward", "clipped reward", "clipped", "correct", "fast_1"],
            [[str(s.step + 1), str(s.rollouts), number(s.raw_reward), number(s.clipped_reward), str(s.clipped),
              percent_text(s.correct_share), percent_text(s.fast_1_share)] for s in view.training.steps],
            "No rollout stored yet.")
    return display


JUDGE_LEGEND = ("Over the run's latest verdicts its judge made (not reused): their count per hour since the one "
                "before them, and where their timing groups' time went. Groups run side by side, so their time can "
                "add to more than the run's; the phases after 'verdict' look inside the ones before them.")


def _judge_text(view: RunView) -> str:
    t = view.judge
    if t is None or not t.evaluations:
        return "Nothing judged yet."
    rate = f"{t.per_hour:.0f} evaluations an hour" if t.per_hour is not None else "no rate yet"
    return f"{rate}: the latest {t.evaluations} verdicts in {duration(t.wall_s)}, {t.groups} timing groups"


def _task_row(t: TaskLine, run_id: int, links: Links) -> list[Cell]:
    slow = slower_beyond_noise(t.speedup_vs_eager, within_noise=t.within_noise)
    compiled = noise_marked(speedup_text(t.speedup_vs_compile), bool(t.speedup_vs_compile) and compile_within_noise(
        eager_within_noise=t.within_noise, compile_within_noise=t.compile_within_noise))
    best: Cell = "-" if t.best_candidate is None else {"text": f"#{t.best_candidate}",
                                                      "href": links.candidate(run_id, t.best_candidate)}
    return [{"text": t.task, "href": links.task(run_id, t.task)}, "-" if t.level is None else str(t.level),
            str(t.candidates), f"{t.correct}/{t.evaluated}", str(t.refused),
            {"text": noise_marked(speedup_text(t.speedup_vs_eager), t.within_noise), "cls": "slow" if slow else ""},
            interval_text(t.interval), compiled, roofline_text(t.roofline_pct), best]


# Charts with more lines than this show the fastest tasks only: a legend of 200 names is not read.
MAX_CHART_SERIES = 10


def _speedup_chart(view: RunView) -> dict[str, Any]:
    finals = {n: next((v for v in reversed(vals) if v is not None), None) for n, vals in view.curve.best.items()}
    ranked = sorted((n for n in finals if finals[n] is not None), key=lambda n: -(finals[n] or 0.0))
    shown = ranked[:MAX_CHART_SERIES]
    return {"title": "best correct speedup so far, per task (log scale)", "x": view.curve.times, "time": True,
            "log": True, "xlabel": "time (this browser's clock)", "ylabel": "best speedup vs eager",
            "series": [{"label": n, "values": view.curve.best[n]} for n in shown]}


def _training_charts(view: RunView) -> dict[str, Any]:
    assert view.training is not None
    steps = view.training.steps
    # Rollouts stored at TRL's global step k belong to step k + 1 (k steps were done before them);
    # the step log counts done steps: both charts count steps from 1, as the trainer's log does.
    xs = [float(s.step + 1) for s in steps]
    charts: dict[str, Any] = {
        "reward": {"title": "reward per step: raw (solid) and clipped, given to the trainer (dashed)", "x": xs,
                   "time": False, "log": False, "xlabel": "training step", "ylabel": "mean reward",
                   "series": [{"label": "raw", "values": [s.raw_reward for s in steps]},
                              {"label": "clipped", "values": [s.clipped_reward for s in steps], "dash": True}]},
        "correct": {"title": "share of rollouts correct, and correct and faster than eager (fast_1)", "x": xs,
                    "time": False, "log": False, "xlabel": "training step", "ylabel": "share of the step's rollouts",
                    "series": [{"label": "correct", "values": [s.correct_share for s in steps]},
                               {"label": "fast_1", "values": [s.fast_1_share for s in steps]}]},
    }
    logged = view.training.logged
    if logged:
        names = sorted({n for rec in logged for n in rec.weights})
        shares = []
        for rec in logged:
            total = sum(rec.weights.values())
            shares.append({n: (rec.weights.get(n, 0.0) / total if total else None) for n in names})
        charts["curriculum"] = {
            "title": "curriculum: each task's share of the next draws", "x": [float(r.step) for r in logged],
            "time": False, "log": False, "xlabel": "training step", "ylabel": "share of draws",
            "series": [{"label": n, "values": [s[n] for s in shares]} for n in names[:MAX_CHART_SERIES * 2]]}
        keys = [k for k in ("loss", "kl", "entropy", "grad_norm") if any(k in r.metrics for r in logged)]
        if keys:
            charts["trainer"] = {"title": "the trainer's own metrics (TRL's logs)", "x": [float(r.step) for r in logged],
                                 "time": False, "log": False, "xlabel": "training step", "ylabel": "value",
                                 "series": [{"label": k, "values": [r.metrics.get(k) for r in logged]} for k in keys]}
    return charts


def run_page(view: RunView, links: Links, *, db_path: str) -> str:
    d = run_display(view, links)
    texts = d["texts"]
    cards = "".join(f"<div class='card'><div class='v' data-card='{i}'>{esc(c['value'])}</div>"
                    f"<div class='k'>{esc(c['label'])}</div></div>" for i, c in enumerate(d["cards"]))
    prog = d["progress"]
    body = [f"<h1 id='status'>{esc(texts['status'])}</h1>",
            f"<p class='sub'>{esc(db_path)}; started {esc(when(view.run.started))}</p>",
            "<div class='progress'>",
            f"<progress id='bar' value='{prog['value']}' max='{max(prog['max'], 1)}'></progress>",
            f" <span id='progress'>{esc(texts['progress'])}</span>; ETA <span id='eta'>{esc(texts['eta'])}</span>;"
            f" elapsed <span id='elapsed'>{esc(texts['elapsed'])}</span>; rate <span id='rate'>{esc(texts['rate'])}"
            f"</span>; idle <span id='idle'>{esc(texts['idle'])}</span>; updated <span id='updated'>"
            f"{esc(texts['updated'])}</span></div>",
            f"<div class='cards'>{cards}</div>",
            "<h2>Tasks</h2>", table_html("tasks", d["tables"]["tasks"]),
            f"<p class='legend'>{esc(NOISE_LEGEND)}</p>",
            # always there: a live page's figures can cross 100 % after it was first drawn
            f"<p class='legend'>{esc(ROOFLINE_LEGEND)}</p>"]
    if view.training is not None:
        body += ["<h2>Training</h2>", _chart("reward"), _chart("correct"), _chart("curriculum"), _chart("trainer"),
                 table_html("steps", d["tables"]["steps"])]
    body += ["<h2>Speedup over time</h2>", _chart("speedup"),
             "<h2>Refused candidates by rule</h2>", table_html("rules", d["tables"]["rules"]),
             "<h3>Latest refused</h3>", table_html("refused", d["tables"]["refused"]),
             "<h2>Candidates per status</h2>", table_html("statuses", d["tables"]["statuses"]),
             "<h2>The judge</h2>", f"<p id='judge_rate'>{esc(texts['judge_rate'])}</p>",
             table_html("judge", d["tables"]["judge"]), f"<p class='legend'>{esc(JUDGE_LEGEND)}</p>"]
    return page(f"run {view.run.id}: kernelrl watch", "".join(body), links, script=True,
                data={"page": "run", "api": links.run_api(view.run.id), "db": db_path})


# ------------------------------------------------------------------------------------ task page


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def evidence_line(d: CandidateDetail, rules: list[str], *, running: bool = True) -> str:
    """One line a person reads first: the mismatch, the rule, the error."""
    r = d.result
    if r is None:
        return ("being judged" if running else
                "not judged: the run ended before it (`kernelrl optimize --resume` judges it)")
    if r.status is Status.FLAGGED:
        return f"refused by {', '.join(rules or r.rejecting_rules)}: {first_line(r.message)}"
    if r.status is Status.CORRECT:
        roof = f", {roofline_text(r.roofline_pct)} of roofline" if r.roofline_pct is not None else ""
        return f"{speedup_text(r.speedup)} ({interval_text(r.speedup_ci)}){roof}"
    return first_line(r.message)


def task_page(view: TaskView, links: Links, *, max_details: int = 300, budget: PageBudget | None = None) -> str:
    run_id, line = view.run.id, view.line
    body = [f"<p class='crumbs'><a href='{esc(links.run(run_id))}'>run {run_id}</a> / task</p>",
            f"<h1>{esc(view.task)}</h1>",
            f"<p class='sub'>level {esc('-' if view.level is None else view.level)}; {line.candidates} candidates, "
            f"{line.correct} correct of {line.evaluated} evaluated, {line.refused} refused; best "
            f"{esc(speedup_text(line.speedup_vs_eager))} vs eager ({esc(interval_text(line.interval))}), "
            f"{esc(speedup_text(line.speedup_vs_compile))} vs torch.compile</p>"]
    hack_rows: list[list[Cell]] = [[{"text": f"#{h.candidate_id}", "href": f"#c{h.candidate_id}"},
                                    {"text": h.rule, "cls": "rule"}, h.stage, "-" if h.line is None else str(h.line),
                                    h.message] for h in view.hack_cases]
    body += ["<h2>Refused (hack cases) and the rule that caught each</h2>",
             table_html("hacks", _table(["candidate", "rule", "stage", "line", "message"], hack_rows,
                                        "No candidate of this task was refused."))]
    rules: dict[int, list[str]] = {h.candidate_id: [] for h in view.hack_cases}
    for h in view.hack_cases:
        rules[h.candidate_id].append(h.rule)
    cand_rows: list[list[Cell]] = []
    for d in view.candidates:
        status = d.result.status.value if d.result else unjudged_label(view.run.status)
        parent: Cell = "reference" if not d.parents else {"text": f"#{d.parents[0]}", "href": f"#c{d.parents[0]}"}
        cand_rows.append([{"text": f"#{d.id}", "href": f"#c{d.id}"}, f"{d.chain}/{d.step}", parent, d.proposer,
                          {"text": status, "cls": f"st-{status.replace(' ', '-')}"},
                          evidence_line(d, rules.get(d.id, []), running=view.run.status == "running")])
    body += ["<h2>Candidates</h2>",
             table_html("candidates", _table(["candidate", "chain/step", "parent", "proposer", "verdict", "evidence"],
                                             cand_rows, "No candidate yet."))]
    shown = view.candidates[-max_details:]
    if len(shown) < len(view.candidates):
        body.append(f"<p class='note'>Details of the latest {len(shown)} candidates below; every candidate has its "
                    "own page (its id in the table).</p>")
    for d in shown:
        parent_source = view.parents.get(d.parents[0]) if d.parents else None
        body.append(candidate_section(d, view.reference, parent_source, links, budget=budget))
        if budget is not None and budget.cancel.is_set():
            break  # the client left: nobody reads the rest
    body.append(f"<details><summary>reference program</summary>{code_html(view.reference)}</details>")
    # live: the script polls the run's JSON and reloads this page when the task's counts move
    return page(f"{view.task}: run {run_id}", "".join(body), links, script=view.run.status == "running",
                data={"page": "task", "api": links.run_api(run_id), "task": view.task,
                      "seen": f"{line.candidates}/{line.evaluated}"})


def candidate_page(d: CandidateDetail, reference: str, parent: str | None, links: Links) -> str:
    body = (f"<p class='crumbs'><a href='{esc(links.run(d.run_id or 0))}'>run {esc(d.run_id)}</a> / "
            f"<a href='{esc(links.task(d.run_id or 0, d.task))}'>{esc(d.task)}</a></p>"
            + candidate_section(d, reference, parent, links, open_code=True))
    # live until judged: the script reloads this page when its task's evaluated count moves
    return page(f"candidate {d.id}: {d.task}", body, links, script=d.result is None and d.run_id is not None,
                data={"page": "candidate", "api": links.run_api(d.run_id or 0), "task": d.task, "seen": ""})


def candidate_section(d: CandidateDetail, reference: str, parent: str | None, links: Links, *,
                      open_code: bool = False, budget: PageBudget | None = None) -> str:
    r = d.result
    status = r.status.value if r else "not judged yet"
    head = (f"<h3>#{d.id} <span class='st-{esc(status.replace(' ', '-'))}'>{esc(status)}</span> "
            f"<span class='meta'>chain {d.chain}, step {d.step}, {esc(d.proposer)}, {esc(when(d.created))}</span>"
            f" <a class='permalink' href='{esc(links.candidate(d.run_id, d.id))}'>page</a></h3>")
    parts = [f"<section class='candidate' id='c{d.id}'>", head]
    if r is not None:
        parts.append(f"<p class='verdict'>{esc(r.message)}</p>")
        parts.append(evidence_html(r, reused_from=d.reused_from))
    op = " open" if open_code else ""
    parts.append(f"<details{op}><summary>code</summary>{code_html(d.source or '(no code block)')}</details>")
    if parent is not None:
        parts.append(f"<details{op}><summary>diff against its parent #{d.parents[0]}</summary>"
                     f"{diff_html(parent, d.source, f'candidate {d.parents[0]}', f'candidate {d.id}', budget)}</details>")
    parts.append(f"<details{op if parent is None else ''}><summary>diff against the reference</summary>"
                 f"{diff_html(reference, d.source, 'reference', f'candidate {d.id}', budget)}</details>")
    parts.append("</section>")
    return "".join(parts)


def evidence_html(r: EvalResult, *, reused_from: int | None = None) -> str:
    rows: list[tuple[str, str]] = []
    if r.status is Status.INCORRECT or "incorrect on input set" in r.message:
        rows.append(("first mismatch", r.errors[0] if r.errors else r.message))
    if r.max_abs_err is not None and r.max_rel_err is not None:
        rows.append(("max error", f"abs {r.max_abs_err:.3g}, rel {r.max_rel_err:.3g}"))
    if r.speedup is not None:
        rows.append(("speedup", f"{r.speedup:.3f}x, 95% interval {interval_text(r.speedup_ci)}"))
    for label, t in (("reference time", r.ref_time), ("candidate time", r.cand_time)):
        if t is not None:
            rows.append((label, f"median {t.median_ms:.4f} ms, IQR {t.iqr_ms:.4f} ms, min {t.min_ms:.4f} ms, n={t.n}"))
    if r.noise_band is not None:
        rows.append(("A/A noise band", interval_text(r.noise_band)))
    timing = r.environment.timing
    if timing is not None:
        rows.append(("timing rounds", f"rounds {timing.rounds}, calls per sample {timing.calls_per_sample}, "
                                      f"stopped by {timing.stopped_by.value}, group size {timing.group_size}, "
                                      f"rel ci half width {timing.rel_ci_half_width:.4f}, wall s {timing.wall_s}"))
    if r.roofline_pct is not None:
        roof = r.environment.roofline
        known = (("memory floor", roof.memory_floor_ms), ("compute floor", roof.compute_floor_ms)) if roof else ()
        floors = ", ".join(f"{name} {v:.4f} ms" for name, v in known if v)
        ref = f"; reference {roofline_text(r.ref_roofline_pct)}" if r.ref_roofline_pct is not None else ""
        rows.append(("% of roofline", f"{roofline_text(r.roofline_pct)}{ref} ({floors})"))
    if r.build_time_s is not None:
        rows.append(("build", f"{r.build_time_s:.2f} s{' (cached)' if r.build_cached else ''}"))
    if r.eval_time_s is not None:
        rows.append(("evaluation", f"{r.eval_time_s:.1f} s"))
    if reused_from is not None:
        rows.append(("verdict", f"reused from candidate #{reused_from} (same source, same settings)"))
    review = r.environment.review
    if review is not None:
        rows.append(("LLM judge", f"{review.answer.value} ({review.model}{', cached' if review.cached else ''}): "
                                  f"{review.reason}"))
    out = ["<dl class='evidence'>"] + [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows] + ["</dl>"]
    if r.findings:
        out.append("<table class='findings'><thead><tr><th>rule</th><th>severity</th><th>stage</th><th>line</th>"
                   "<th>message</th></tr></thead><tbody>")
        out += [f"<tr><td class='rule'>{esc(f.rule)}</td><td>{esc(f.severity.value)}</td><td>{esc(f.stage)}</td>"
                f"<td>{esc('-' if f.line is None else f.line)}</td><td>{esc(f.message)}</td></tr>" for f in r.findings]
        out.append("</tbody></table>")
    mismatch_only = r.status is Status.INCORRECT and len([e for e in r.errors if e.strip()]) <= 1  # shown above
    if r.errors and r.status is not Status.CORRECT and not mismatch_only:
        text = "\n".join(e.rstrip() for e in r.errors if e.strip())
        label = "compiler output" if r.status is Status.COMPILE_ERROR else "errors"
        if len(text) > MAX_ERROR_CHARS:
            text = "... (" + str(len(text) - MAX_ERROR_CHARS) + " characters before)\n" + text[-MAX_ERROR_CHARS:]
        out.append(f"<details open><summary>{label}</summary><pre class='errors'>{esc(text)}</pre></details>")
    return "".join(out)


def waiting_page(title: str, message: str, links: Links, *, status_line: str = "", every_s: int = 2) -> str:
    """A page for something that is not there yet: it reloads itself every `every_s` seconds."""
    body = f"<h1>{esc(title)}</h1><p class='note'>{esc(message)}</p><p class='sub'>{esc(status_line)}</p>"
    return page(title, body, links).replace("<head>", f"<head><meta http-equiv='refresh' content='{int(every_s)}'>", 1)


def message_page(title: str, message: str, links: Links, *, status_line: str = "") -> str:
    return page(title, f"<h1>{esc(title)}</h1><p>{esc(message)}</p><p class='sub'>{esc(status_line)}</p>", links)

