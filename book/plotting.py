"""Plotting helpers shared by the book's pages (drawing only: no attention maths lives here).

The pages compute everything they plot with the reference solutions
(``autograder.references.load_reference``); this module only turns arrays into figures
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
