"""PNG curves from a metrics file, in the style of the paper's figures."""

from __future__ import annotations

from pathlib import Path

from sapo_node.metrics import read_metrics


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (shorter at the start).

    >>> moving_average([0, 2, 4, 6], 2)
    [0.0, 1.0, 3.0, 5.0]
    """
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_metrics(metrics: Path, out_dir: Path, window: int = 10) -> list[Path]:
    """Write reward.png, cumulative_reward.png and levels.png; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics)
    if not rows:
        raise ValueError(f"{metrics} holds no rounds")
    out_dir.mkdir(parents=True, exist_ok=True)
    rounds = [r["round"] for r in rows]
    reward = [r["reward/mean"] for r in rows]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(rounds, reward, alpha=0.35, label="reward (round mean)")
    ax.plot(rounds, moving_average(reward, window), label=f"moving average ({window})")
    families = sorted({k for r in rows for k in r if k.startswith("family_reward/")})
    for key in families if len(families) > 1 else []:
        ys = [r.get(key) for r in rows]
        pts = [(x, y) for x, y in zip(rounds, ys, strict=True) if y is not None]
        ax.plot(*zip(*pts, strict=True), ".", ms=3, label=key.removeprefix("family_reward/"))
    ax.set(xlabel="round", ylabel="reward", title="Reward of own completions", ylim=(-0.02, 1.02))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(rounds, [r["reward/cumulative"] for r in rows])
    ax.set(xlabel="round", ylabel="cumulative reward", title="Cumulative reward")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "cumulative_reward.png"))

    levels = sorted({k for r in rows for k in r if k.startswith("family_level/")})
    if levels:
        fig, ax = plt.subplots(figsize=(7, 3))
        for key in levels:
            ax.step(
                rounds,
                [r.get(key, 0) for r in rows],
                where="post",
                label=key.removeprefix("family_level/"),
            )
        ax.set(xlabel="round", ylabel="level", title="Curriculum level")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
        written.append(_save(fig, out_dir / "levels.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
