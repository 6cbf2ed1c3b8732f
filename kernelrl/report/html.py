"""The HTML report: one self-contained file, tables plus matplotlib plots embedded as PNGs.

Guarantees: `write_html(report, path)` writes a file that needs nothing else to display (no
scripts, no external images); a plot with nothing to plot is a sentence saying so, never a faked
chart; headline figures carry their range (the geomean of the tasks' 95 % interval ends) and
their counts; the page reads at phone width (viewport set, wide tables scroll sideways inside
their box, plots shrink to the screen).
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.report.console import (
    ROOFLINE_LEGEND,
    interval_text,
    percent_text,
    roofline_above,
    roofline_text,
    speedup_text,
)
from kernelrl.report.metrics import NOISE_LEGEND, compile_within_noise, noise_marked, slower_beyond_noise
from kernelrl.report.report import Report

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

_GOOD, _BAD, _INK, _GRID = "#2a9d8f", "#e76f51", "#264653", "#d9d9d9"
_NOISE = "#a8a8a8"  # within noise: neither faster nor slower (the tables' legend: red only beyond noise)


def _standing_colour(speedup: float, within_noise: bool) -> str:
    if within_noise:
        return _NOISE
    return _BAD if slower_beyond_noise(speedup, within_noise=False) else _GOOD


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _style(ax: Axes) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, which="major", color=_GRID, linewidth=0.8)
    ax.set_axisbelow(True)


_NICE = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0,
         30.0, 50.0, 75.0, 100.0, 200.0, 500.0, 1000.0)


def _speedup_axis(axis: Axis, lo: float, hi: float) -> None:
    """Readable ticks on a log speedup axis: round factors like 0.5x 1x 1.5x 2x 3x, at most about 8."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ticks = [t for t in _NICE if lo <= t <= hi]
    if len(ticks) < 4:  # a narrow range: finer steps
        ticks = sorted({round(x * 0.1, 1) for x in range(1, 100)} | set(_NICE))
        ticks = [t for t in ticks if lo <= t <= hi]
    while len(ticks) > 8:  # thin out, keeping 1x
        keep = ticks[::2]
        if 1.0 in ticks and 1.0 not in keep:
            keep = sorted(set(keep) | {1.0})
        ticks = keep
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))


def plot_distribution(report: Report) -> str | None:
    """Histogram of per-task best speedup against eager, log x; base64 PNG (None: nothing solved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib import ticker

    solved = [(float(r.speedup_vs_eager), r.within_noise) for r in report.tasks if r.speedup_vs_eager is not None]
    if not solved:
        return None
    values = [v for v, _ in solved]
    lo, hi = min(min(values), 1.0) / 1.15, max(max(values), 1.0) * 1.15
    bins = np.geomspace(lo, hi, max(8, min(30, 2 * len(values))))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    # one bar per standing, stacked: faster, within noise, slower (the colours of every surface)
    groups = [(_GOOD, "faster"), (_NOISE, "within noise"), (_BAD, "slower")]
    data = [[v for v, n in solved if _standing_colour(v, n) == colour] for colour, _ in groups]
    ax.hist(data, bins=list(bins), stacked=True, color=[c for c, _ in groups], label=[w for _, w in groups],
            edgecolor="white", linewidth=0.8)
    ax.legend(loc="upper right", fontsize=9, frameon=False)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    _speedup_axis(ax.xaxis, lo, hi)
    ax.axvline(1.0, color=_INK, linewidth=1.2)
    ax.text(1.0, 1.0, " eager", transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=10, color=_INK)
    if report.geomean_vs_eager is not None:
        ax.axvline(report.geomean_vs_eager, color=_INK, linestyle="--", linewidth=1.2)
        ax.text(report.geomean_vs_eager, 0.9, f" geomean {report.geomean_vs_eager:.2f}x",
                transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=10, color=_INK,
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5})
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("best speedup against eager PyTorch (log scale)")
    ax.set_ylabel("tasks")
    noisy = f" ({report.noisy_above_one} more within noise)" if report.noisy_above_one else ""
    ax.set_title(f"Best speedup per task: {report.faster} of {len(report.tasks)} tasks faster than eager{noisy}",
                 loc="left", fontsize=12, wrap=True)
    _style(ax)
    return _png(fig)


def _wrapped(name: str, width: int) -> str:
    """A task name on lines of about `width` characters, broken after `/` and `_` (whole, never cut)."""
    lines = [""]
    for part in re.split(r"(?<=[/_])", name):
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def plot_per_task(report: Report) -> str | None:
    """Per-task best speedup against eager and torch.compile, sorted; None when nothing is solved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    solved = [(r.speedup_vs_eager, r) for r in report.tasks if r.speedup_vs_eager is not None]
    rows = [r for _, r in sorted(solved, key=lambda pair: pair[0])]
    if not rows:
        return None
    rows = rows[-60:]  # the fastest 60: more bars are not readable
    y = np.arange(len(rows))
    # Task names whole, wrapped, so the figure is not widened by its longest name (and scaled down
    # on a phone with it): names are the point of this chart.
    names = [_wrapped(r.task, 22) for r in rows]
    per_row = 0.22 + 0.2 * max(n.count("\n") + 1 for n in names)
    fig, ax = plt.subplots(figsize=(6.4, 0.8 + per_row * len(rows)))
    eager = [float(r.speedup_vs_eager or 1.0) for r in rows]
    ax.barh(y, [e - 1 for e in eager], left=1, height=0.6,
            color=[_standing_colour(e, r.within_noise) for e, r in zip(eager, rows)])
    # One legend entry per bar colour: a bar's label would show the first bar's colour only.
    handles: list[Artist] = [Patch(color=_GOOD, label="against eager: faster"),
                          Patch(color=_NOISE, label="against eager: within noise"),
                          Patch(color=_BAD, label="against eager: slower")]
    comp = [(i, float(r.speedup_vs_compile)) for i, r in enumerate(rows) if r.speedup_vs_compile is not None]
    if comp:
        handles.append(ax.scatter([c for _, c in comp], [i for i, _ in comp], marker="D", s=22, color=_INK,
                                  zorder=3, label="against torch.compile"))
    ax.set_xscale("log")
    everything = eager + [c for _, c in comp] + [1.0]
    lo, hi = min(everything) / 1.1, max(everything) * 1.25
    ax.set_xlim(lo, hi)
    _speedup_axis(ax.xaxis, lo, hi)
    comp_at = dict(comp)
    for i, e in enumerate(eager):
        # label past the bar's end and past the compile marker, so neither hides it
        end = max(e, comp_at.get(i, e)) if e >= 1 else min(e, comp_at.get(i, e))
        ax.text(end * (1.03 if e >= 1 else 0.97), i, f"{e:.2f}x", va="center", ha="left" if e >= 1 else "right",
                fontsize=9, color="#444444")
    ax.axvline(1.0, color=_INK, linewidth=1.0)
    ax.set_yticks(y, names, fontsize=10)
    ax.tick_params(axis="x", labelsize=10)
    ax.set_xlabel("best speedup (log scale)", fontsize=10)
    ax.set_title("Best candidate per task", loc="left", fontsize=12)
    # below the axis title, ~0.6 inch under the axes whatever their height
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (per_row * len(rows))),
              ncol=2, fontsize=10, frameon=False)
    _style(ax)
    ax.grid(False, axis="y")
    return _png(fig)


def plot_best_so_far(report: Report) -> str | None:
    """Best-so-far speedup against candidates evaluated, one line per task; None without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    rows = [r for r in report.tasks if any(v is not None for v in r.best_so_far)]
    if not rows:
        return None
    # legend order = final standing, fastest first
    rows.sort(key=lambda r: -max(v for v in r.best_so_far if v is not None))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    cmap = plt.get_cmap("tab10" if len(rows) <= 10 else "viridis")
    for i, r in enumerate(rows):
        xs = [j + 1 for j, v in enumerate(r.best_so_far) if v is not None]
        ys = [v for v in r.best_so_far if v is not None]
        color = cmap(i % 10) if len(rows) <= 10 else cmap(i / max(1, len(rows) - 1))
        ax.step(xs, ys, where="post", color=color, linewidth=1.6 if len(rows) <= 10 else 0.9, alpha=0.9,
                label=r.task)
        # every evaluation a point while there are few of them (two points read as a jump, not a curve)
        ax.plot(xs if len(xs) <= 20 else xs[-1:], ys if len(xs) <= 20 else ys[-1:], "o", color=color, markersize=4)
    ax.set_yscale("log")
    values = [v for r in rows for v in r.best_so_far if v is not None] + [1.0]
    lo, hi = min(values) / 1.1, max(values) * 1.1
    ax.set_ylim(lo, hi)
    _speedup_axis(ax.yaxis, lo, hi)
    ax.axhline(1.0, color=_INK, linewidth=1.0, linestyle=":")
    ax.set_xlabel("candidates evaluated for the task", fontsize=10)
    ax.set_ylabel("best correct speedup so far", fontsize=10)
    ax.tick_params(labelsize=10)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_title("Search progress: best speedup so far", loc="left", fontsize=12)
    if len(rows) <= 12:  # below the chart: beside it, it widens the figure and shrinks the text on a phone
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.16), ncol=2, fontsize=9, frameon=False)
    _style(ax)
    return _png(fig)


# ------------------------------------------------------------------------------------ HTML
_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; color: #222; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
.sub { color: #666; margin-top: 0; } .legend { color: #555; font-size: 0.85em; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 1em 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 9em; }
.card .v { font-size: 1.5em; font-weight: 600; color: #264653; } .card .k { color: #666; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 0.25em 0.8em; border-bottom: 1px solid #eee; text-align: right; }
td { white-space: nowrap; } td:first-child { white-space: normal; }
th { background: #f6f6f6; } td:first-child, th:first-child { text-align: left; }
td.slow { color: #c0392b; } img { max-width: 100%; height: auto; display: block; margin: 0.6em 0; }
@media (max-width: 640px) {
  /* a phone: each row a block of labelled lines, so no column is hidden off the screen's edge */
  table.stack, table.stack tbody, table.stack tr, table.stack td { display: block; width: 100%; }
  table.stack tr.head { display: none; }
  table.stack tr { border-bottom: 1px solid #ddd; padding: 0.3em 0; }
  table.stack td { border: none; text-align: right; padding: 0.1em 0; }
  table.stack td::before { content: attr(data-label); float: left; color: #666; padding-right: 1em; }
  table.stack td:first-child { text-align: left; font-weight: 600; overflow-wrap: anywhere; }
  table.stack td:first-child::before { content: none; }
}
.card .r { color: #666; font-size: 0.8em; } .scroll { overflow-x: auto; } .empty { color: #666; font-style: italic; }
@media (max-width: 600px) { body { margin: 1em auto; padding: 0 0.6em; } .card { min-width: 7em; padding: 0.4em 0.6em; }
  .card .v { font-size: 1.2em; } th, td { padding: 0.2em 0.5em; } table { font-size: 0.8em; } }
"""


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """A table; on a narrow screen each row stacks into labelled lines (`table.stack`)."""
    out = ["<div class='scroll'><table class='stack'><tr class='head'>"
           + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append("<tr>" + "".join(f"<td{cls} data-label='{html.escape(h, quote=True)}'>{html.escape(c)}</td>"
                                    for h, c in zip(header, row)) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def render_html(report: Report) -> str:
    scope = f"run {report.run_id}" if report.run_id is not None else "all runs"
    n = len(report.tasks)
    span = report.geomean_range_vs_eager
    cards = [("geomean of the tasks' best vs eager", speedup_text(report.geomean_vs_eager),
              (f"{span[0]:.2f}-{span[1]:.2f}x within the tasks' 95% intervals; " if span else "")
              + f"over {report.solved} solved tasks"),
             ("median of the tasks' best vs eager", speedup_text(report.median_vs_eager),
              f"over {report.solved} solved tasks"),
             ("geomean of the tasks' best vs torch.compile", speedup_text(report.geomean_vs_compile),
              f"over {report.with_compile} tasks with a compile baseline"),
             ("median of the tasks' best vs torch.compile", speedup_text(report.median_vs_compile),
              f"over {report.with_compile} tasks with a compile baseline"),
             *[(f"fast_{p:g}", percent_text(v), f"{round(v * n)} of {n} tasks"
                + (", noise excluded" if p >= 1 else "")) for p, v in report.fast_p],
             ("success rate", percent_text(report.success_rate), f"{report.correct} of {report.evaluated} judged")]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'>"
             "<meta name='viewport' content='width=device-width, initial-scale=1'><title>kernelrl report</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>kernelrl report</h1>",
             f"<p class='sub'>{html.escape(report.db_path)} ({scope}): {len(report.tasks)} tasks, "
             f"{report.solved} with a correct candidate; {report.candidates} candidates, {report.evaluated} "
             f"evaluated, {report.correct} correct. Speedups are over the {report.solved} solved tasks "
             f"({report.with_compile} with a torch.compile baseline).</p>",
             "<div class='cards'>" + "".join(f"<div class='card'><div class='v'>{html.escape(v)}</div>"
                                             f"<div class='k'>{html.escape(k)}</div>"
                                             f"<div class='r'>{html.escape(r)}</div></div>" for k, v, r in cards)
             + "</div>"]
    for title, png in (("Speedup distribution", plot_distribution(report)),
                       ("Per task", plot_per_task(report)),
                       ("Best so far against candidates evaluated", plot_best_so_far(report))):
        if png is not None:
            parts.append(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{png}'>")
        else:
            parts.append(f"<h2>{title}</h2><p class='empty'>Nothing to plot yet: no task has a correct, timed "
                         "candidate.</p>")
    ranked = sorted(report.tasks, key=lambda r: -(r.speedup_vs_eager or 0.0))
    parts.append("<h2>Best candidate per task</h2>")
    parts.append(_table(["task", "candidates", "correct / evaluated", "vs eager", "95% interval", "vs torch.compile",
                         "eager ms", "compile ms", "% of roofline", "best candidate"],
                        [[r.task, str(r.candidates), f"{r.correct}/{r.evaluated}",
                          noise_marked(speedup_text(r.speedup_vs_eager), r.within_noise),
                          interval_text(r.ci_vs_eager),
                          noise_marked(speedup_text(r.speedup_vs_compile), bool(r.speedup_vs_compile) and
                                       compile_within_noise(eager_within_noise=r.within_noise,
                                                            compile_within_noise=r.compile_within_noise)),
                          _ms(r.eager_ms), _ms(r.compile_ms),
                          roofline_text(r.roofline_pct),
                          "-" if r.best_candidate is None else str(r.best_candidate)] for r in ranked],
                        ["slow" if slower_beyond_noise(r.speedup_vs_eager, within_noise=r.within_noise) else ""
                         for r in ranked]))
    parts.append(f"<p class='legend'>{html.escape(NOISE_LEGEND)}</p>")
    if roofline_above([r.roofline_pct for r in report.tasks]):
        parts.append(f"<p class='legend'>{html.escape(ROOFLINE_LEGEND)}</p>")
    parts.append("<h2>Candidates per status</h2>")
    parts.append(_table(["status", "candidates"], [[s, str(n)] for s, n in report.status_counts]))
    parts.append("<h2>Refused (flagged) candidates per rule</h2>")
    parts.append(_table(["rule", "candidates"], [[r, str(n)] for r, n in report.refused_by_rule])
                 if report.refused_by_rule else "<p>No candidate was refused.</p>")
    if report.runs:
        parts.append("<h2>Runs</h2>")
        parts.append(_table(["run", "started (UTC)", "status", "proposer", "candidates"],
                            [[str(r.id), time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.started)), r.status,
                              r.proposer, str(r.candidates)] for r in report.runs]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(report: Report, path: str | Path) -> Path:
    """Write the self-contained HTML report; return its path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a run's tasks and verdicts: the file is its owner's alone (0600), however the umask is set, as
    # the run database and its exports are (an existing file keeps its mode)
    with open(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        f.write(render_html(report))
    return out
