"""PNG plots: goodput over time (the paper's Figure 11) and goodput vs request rate (Figure 15)."""

from __future__ import annotations

from pathlib import Path

from jitserve.sim.metrics import Report


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(i: int, name: str) -> dict[str, object]:
    """Twelve policies need more than matplotlib's ten default colours; JITServe stands out."""
    import matplotlib

    colour = matplotlib.colormaps["tab20"](i % 20)
    bold = name.startswith("jitserve")
    return {"color": colour, "linewidth": 2.6 if bold else 1.3, "linestyle": "-" if i < 10 else "--"}


def goodput_over_time(reports: dict[str, Report], path: Path, title: str = "") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, r) in enumerate(reports.items()):
        xs = [k * r.timeline_bin_s / 60.0 for k in range(len(r.goodput_timeline))]
        ax.plot(xs, r.goodput_timeline, label=r.label or name, **_style(i, name))  # type: ignore[arg-type]
    ax.set_xlabel("time (min)")
    ax.set_ylabel("token goodput (tokens/s)")
    ax.set_title(title or "Service goodput over time")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def goodput_vs_rate(
    by_rate: dict[float, dict[str, Report]], path: Path, metric: str = "token_goodput"
) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    rates = sorted(by_rate)
    policies = list(by_rate[rates[0]])
    for i, name in enumerate(policies):
        ys = [getattr(by_rate[r][name], metric) for r in rates]
        label = by_rate[rates[0]][name].label or name
        ax.plot(rates, ys, marker="o", label=label, **_style(i, name))  # type: ignore[arg-type]
    ax.set_xlabel("request rate per replica (req/s)")
    ax.set_ylabel(metric.replace("_", " ") + " (/s)")
    ax.set_title("Goodput vs request rate")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
