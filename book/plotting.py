"""Plotting helpers shared by the book's pages (drawing only: no attention maths lives here).

The pages compute everything they plot with the reference solutions
(``autograder.references.solutions.load_reference``); this module only turns arrays into figures
with one consistent look.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

BLUE = "#3465a4"
ORANGE = "#f57900"
GREEN = "#4e9a06"
RED = "#cc0000"
GREY = "#888a85"


def setup() -> None:
    """Matplotlib defaults for the book: PNG figures at twice their shown size (crisp on
    high-density screens), text of at least 10 pt, light grid."""
    try:  # inside a Jupyter kernel: a PNG with twice the pixels, shown at its nominal size
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("retina")
    except Exception:  # pragma: no cover - plain Python
        pass
    plt.rcParams.update({
        "figure.dpi": 100,
        "savefig.dpi": 100,
        "font.size": 11,
        "axes.titlesize": 11,
        "legend.fontsize": 10,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": False,
        "figure.constrained_layout.use": True,
    })


def to_numpy(x) -> np.ndarray:
    """A tensor (any device, with or without grad) or array as a float numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=float)


def _label_cells(ax, rows, cols, xlabels, ylabels):
    """One tick per row and column of a matrix image, labelled (tokens) or numbered."""
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))
    ax.set_xticklabels(xlabels if xlabels is not None else range(cols), rotation=45 if xlabels else 0,
                       ha="right" if xlabels else "center")
    ax.set_yticklabels(ylabels if ylabels is not None else range(rows))


def heatmap(ax, weights, xlabels=None, ylabels=None, *, title=None, annotate=True,
            cmap="Blues", vmin=0.0, vmax=None, xlabel="key", ylabel="query", fmt="{:.2f}",
            colorbar=False):
    """Draw a (rows, cols) matrix, e.g. attention weights with queries as rows."""
    w = to_numpy(weights)
    im = ax.imshow(w, cmap=cmap, vmin=vmin, vmax=vmax if vmax is not None else max(w.max(), 1e-12),
                   aspect="auto")
    rows, cols = w.shape
    _label_cells(ax, rows, cols, xlabels, ylabels)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate and rows * cols <= 100:
        top = im.norm.vmax
        for i in range(rows):
            for j in range(cols):
                ax.text(j, i, fmt.format(w[i, j]), ha="center", va="center", fontsize=10,
                        color="white" if w[i, j] > 0.6 * top else "black")
    if colorbar:
        plt.colorbar(im, ax=ax, shrink=0.85)
    return im


def bars(ax, values, labels, *, highlight=None, title=None, ylabel="attention weight"):
    """A bar chart of one attention distribution, with the values written on the bars."""
    v = to_numpy(values)
    colors = [ORANGE if i == highlight else BLUE for i in range(len(v))]
    ax.bar(range(len(v)), v, color=colors)
    ax.set_xticks(range(len(v)))
    ax.set_xticklabels(labels)
    ax.set_ylabel(ylabel)
    for i, h in enumerate(v):
        ax.annotate(f"{h:.2f}", (i, h), ha="center", va="bottom", fontsize=10)
    ax.set_ylim(0, max(v.max() * 1.18, 1e-9))
    if title:
        ax.set_title(title)


def mask_image(ax, mask, xlabels=None, ylabels=None, *, title=None, xlabel="key", ylabel="query"):
    """A boolean mask as an image: green = may attend (True), grey = masked (False)."""
    from matplotlib.colors import ListedColormap

    m = to_numpy(mask).astype(bool)
    ax.imshow(m, cmap=ListedColormap(["#d3d7cf", "#73d216"]), vmin=0, vmax=1, aspect="equal")
    rows, cols = m.shape
    _label_cells(ax, rows, cols, xlabels, ylabels)
    ax.set_xticks(np.arange(-0.5, cols), minor=True)
    ax.set_yticks(np.arange(-0.5, rows), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)


# --------------------------------------------------------------------------------------------
# Schematic diagrams (drawn at build time, no data: boxes, arrows and labels only)

def _box(ax, x, y, w, h, text="", color=BLUE, alpha=0.18, fontsize=11, edge=None, **kw):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                facecolor=color, alpha=alpha, edgecolor="none"))
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                facecolor="none", edgecolor=edge or color, lw=1.3))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **kw)


def _arrow(ax, start, end, color="#555753", lw=1.2, style="-|>", **kw):
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color,
                                 lw=lw, shrinkA=2, shrinkB=2, **kw))


def _canvas(width, height, xlim, ylim):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


def diagram_token_flow(n_keys: int = 4, i: int = 1):
    """Scaled dot-product attention for one query token i: project, score, softmax, pool."""
    fig, ax = _canvas(10, 4.6, (-0.3, 14.4), (-1.4, n_keys + 1.9))
    top = n_keys + 0.55
    cols = {"x": 0.0, "k": 2.2, "s": 4.4, "a": 6.6, "v": 8.8, "z": 11.6}
    labels = {"x": "tokens", "k": "keys", "s": "scores", "a": "weights", "v": "values"}
    notes = {"k": r"$\mathbf{x}_j W^K$", "s": r"$\mathbf{q}_i^\top \mathbf{k}_j / \sqrt{d_k}$",
             "a": r"softmax over $j$", "v": r"$\mathbf{x}_j W^V$"}
    for key, label in labels.items():
        ax.text(cols[key] + 0.6, -0.55, label, ha="center", va="center", fontsize=11, color=GREY)
        if key in notes:
            ax.text(cols[key] + 0.6, -1.1, notes[key], ha="center", va="center", fontsize=10)
    for j in range(n_keys):
        y = n_keys - 1 - j
        _box(ax, cols["x"], y + 0.1, 1.2, 0.8, rf"$\mathbf{{x}}_{j}$", color=ORANGE if j == i else GREY)
        _box(ax, cols["k"], y + 0.1, 1.2, 0.8, rf"$\mathbf{{k}}_{j}$", color=BLUE)
        _box(ax, cols["s"], y + 0.1, 1.2, 0.8, rf"$s_{{{i}{j}}}$", color=BLUE, alpha=0.08)
        _box(ax, cols["a"], y + 0.1, 1.2, 0.8, rf"$\alpha_{{{i}{j}}}$", color=ORANGE,
             alpha=0.1 + 0.12 * (3 - abs(j - 2)))
        _box(ax, cols["v"], y + 0.1, 1.2, 0.8, rf"$\mathbf{{v}}_{j}$", color=GREEN)
        _arrow(ax, (cols["x"] + 1.2, y + 0.5), (cols["k"], y + 0.5))
        _arrow(ax, (cols["k"] + 1.2, y + 0.5), (cols["s"], y + 0.5), color=BLUE)
        _arrow(ax, (cols["s"] + 1.2, y + 0.5), (cols["a"], y + 0.5))
        _arrow(ax, (cols["a"] + 1.2, y + 0.5), (cols["v"], y + 0.5), color=ORANGE)
        ax.text(cols["a"] + 1.6, y + 0.62, r"$\times$", ha="center", fontsize=10, color=ORANGE)
        _arrow(ax, (cols["v"] + 1.2, y + 0.5), (cols["z"], 1.9), color=GREEN, lw=1.0)
    _box(ax, cols["s"] - 0.3, top, 1.8, 0.8, rf"$\mathbf{{q}}_{i} = \mathbf{{x}}_{i} W^Q$", color=ORANGE, fontsize=10)
    _arrow(ax, (cols["x"] + 0.6, n_keys - 1 - i + 0.9), (cols["s"] - 0.3, top + 0.4), color=ORANGE,
           connectionstyle="arc3,rad=-0.25")
    ax.plot([cols["s"] + 1.35, cols["s"] + 1.35], [top, 0.3], color=ORANGE, lw=1.0, ls="--")
    _box(ax, cols["z"], 1.4, 2.3, 1.0, rf"$\mathbf{{z}}_{i} = \sum_j \alpha_{{{i}j}} \mathbf{{v}}_j$",
         color=ORANGE, fontsize=10)
    ax.text(cols["z"] + 1.15, 0.9, f"output of token {i}", ha="center", fontsize=10, color=GREY)
    ax.set_title(f"Scaled dot-product attention for token {i}; every token does the same, in parallel",
                 fontsize=11)
    return fig


def diagram_multi_head(heads: int = 4):
    """Multi-head attention as split, attend per head, merge, output projection."""
    from matplotlib.patches import Rectangle

    colors = [BLUE, ORANGE, GREEN, RED, "#75507b", "#c4a000"][:heads]
    fig, ax = _canvas(10, 3.8, (-0.4, 17.2), (-1.6, 5.0))
    L = 3.0  # drawn height of the sequence axis

    def striped(x, y, w):
        for h, c in enumerate(colors):
            ax.add_patch(Rectangle((x + h * w / heads, y), w / heads, L, facecolor=c, alpha=0.45, edgecolor="white"))

    ax.add_patch(Rectangle((0, 0.5), 2.0, L, facecolor=GREY, alpha=0.35, edgecolor="none"))
    ax.text(1.0, 0.5 + L / 2, "$X$", ha="center", va="center", fontsize=12)
    ax.text(1.0, -0.3, "$(B, L, E)$", ha="center", fontsize=10)
    _arrow(ax, (2.1, 2.0), (3.0, 2.0))
    ax.text(2.55, 2.3, "$W^{Q,K,V}$", ha="center", fontsize=10)
    striped(3.1, 0.5, 2.0)
    ax.text(4.1, -0.3, "$Q, K, V$: $(B, L, E)$", ha="center", fontsize=10)
    ax.text(4.1, 3.75, "heads = slices of $E$", ha="center", fontsize=10, color=GREY)
    _arrow(ax, (5.2, 2.0), (6.3, 2.0))
    ax.text(5.75, 2.35, "split", ha="center", fontsize=10)
    for h, c in enumerate(colors):
        x = 6.4 + h * 0.75
        ax.add_patch(Rectangle((x, 0.5 + 0.12 * h), 0.5, L, facecolor=c, alpha=0.45, edgecolor="white"))
    ax.text(7.9, -0.3, "$(B, H, L, d_h)$", ha="center", fontsize=10)
    ax.text(7.9, 4.1, "view, transpose", ha="center", fontsize=10, color=GREY)
    _arrow(ax, (9.4, 2.0), (10.3, 2.0))
    for h, c in enumerate(colors):
        y = 0.4 + h * 0.95
        ax.add_patch(Rectangle((10.4, y), 0.8, 0.8, facecolor=c, alpha=0.3, edgecolor=c))
        ax.text(10.8, y + 0.4, f"{h}", ha="center", va="center", fontsize=10)
    ax.text(10.8, -0.3, "attend\nper head", ha="center", va="top", fontsize=10)
    ax.text(10.8, 4.55, r"$\mathrm{softmax}(Q_h K_h^\top/\sqrt{d_h})\,V_h$", ha="center", fontsize=10)
    _arrow(ax, (11.4, 2.0), (12.3, 2.0))
    ax.text(11.85, 2.35, "merge", ha="center", fontsize=10)
    striped(12.4, 0.5, 2.0)
    ax.text(13.4, -0.3, "concat: $(B, L, E)$", ha="center", fontsize=10)
    _arrow(ax, (14.5, 2.0), (15.1, 2.0))
    ax.text(14.8, 2.35, "$W^O$", ha="center", fontsize=10)
    ax.add_patch(Rectangle((15.2, 0.5), 1.6, L, facecolor="#5c3566", alpha=0.35, edgecolor="none"))
    ax.text(16.0, -0.3, "output", ha="center", fontsize=10)
    ax.text(16.0, 0.5 + L / 2, "mixes\nheads", ha="center", va="center", fontsize=9.5)
    ax.set_title(f"Multi-head attention with $H = {heads}$ heads: split, attend, merge, project", fontsize=11)
    return fig


def diagram_msa_axes(n_seq: int = 4, n_res: int = 6):
    """Row, column and global column attention over an MSA (N_seq, N_res) grid."""
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.7))
    row, col, query = 1, 2, 1   # the highlighted sequence, residue, and the query within them
    titles = ["row attention (attn_dim=-2):\nresidues of one sequence",
              "column attention (attn_dim=-3):\nsequences at one residue",
              "global column attention:\none mean query per head"]
    for k, ax in enumerate(axes):
        ax.set_xlim(-0.8, n_res + 0.6)
        ax.set_ylim(-1.6, n_seq + 0.9)
        ax.set_aspect("equal")
        ax.axis("off")
        for s in range(n_seq):
            for r in range(n_res):
                hot = (k == 0 and s == row) or (k > 0 and r == col)
                me = (k == 0 and s == row and r == query) or (k == 1 and r == col and s == query)
                ax.add_patch(Rectangle((r, n_seq - 1 - s), 0.9, 0.9,
                                       facecolor=RED if me else ORANGE if hot else "#d3d7cf",
                                       alpha=0.75 if hot else 0.6, edgecolor="white"))
        ax.text(n_res / 2 - 0.05, -0.45, r"residues ($N_\mathrm{res}$)", ha="center", va="center", fontsize=10)
        ax.text(-0.35, n_seq / 2 - 0.05, r"sequences ($N_\mathrm{seq}$)", ha="center", va="center",
                rotation=90, fontsize=10)
        ax.set_title(titles[k], fontsize=10.5)
    y = n_seq - 1 - row + 0.9
    for r in range(n_res):
        if r != query:
            _arrow(axes[0], (query + 0.45, y), (r + 0.45, y), color=RED, lw=1.0,
                   connectionstyle=f"arc3,rad={-0.5 if r > query else 0.5}")
    axes[0].text(n_res / 2, -1.15, r"+ pair bias $b_{ij}$ from $z$", ha="center", fontsize=10, color=RED)
    x = col + 0.9
    ys = [n_seq - 1 - s + 0.45 for s in range(n_seq)]
    for s in range(n_seq):
        if s != query:
            _arrow(axes[1], (x, ys[query]), (x, ys[s]), color=RED, lw=1.0,
                   connectionstyle=f"arc3,rad={0.5 if s > query else -0.5}")
    axes[1].text(n_res / 2, -1.15, r"one attention per residue column", ha="center", fontsize=10, color=GREY)
    ax = axes[2]
    qx, qy = n_res - 1.2, n_seq / 2 - 0.45
    ax.add_patch(Rectangle((qx, qy), 0.9, 0.9, facecolor=RED, alpha=0.75, edgecolor="white"))
    ax.text(qx + 0.45, qy + 0.45, r"$\bar{\mathbf{q}}$", ha="center", va="center", fontsize=11)
    for s in range(n_seq):
        _arrow(ax, (col + 0.9, ys[s]), (qx, qy + 0.45), color=GREY, lw=0.8, style="-")
        _arrow(ax, (qx + 0.2, qy + 0.9 if ys[s] > qy else qy), (col + 0.7, ys[s] + (0.3 if ys[s] > qy else -0.3)),
               color=RED, lw=1.0, connectionstyle=f"arc3,rad={0.35 if ys[s] > qy else -0.35}")
    ax.text(n_res / 2, -1.15, r"mean of the queries; cost linear in $N_\mathrm{seq}$", ha="center",
            fontsize=10, color=GREY)
    return fig
