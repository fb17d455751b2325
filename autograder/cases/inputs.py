"""How test inputs are made: seeded random tensors, masks, and distinct module weights.

All inputs are made on the CPU in float64 from a torch.Generator; the executor moves and casts
them. Grading seeds differ from the self-check's, so the graded inputs are ones the student has
not seen (instructors can change them with AUTOGRADER_SEED).
"""
from __future__ import annotations

import torch

from .. import settings as _settings

SELF_CHECK_SEED = 1234
DEFAULT_SEED = 20261121  # public (it is in the package): `grade` on one's own machine only


class PublicSeed(ValueError):
    """A graded deployment without a course seed of its own (`course_seed`)."""


def grading_seed(settings=None) -> int:
    """The seed of `grade` on one's own machine: $AUTOGRADER_SEED, else the public DEFAULT_SEED."""
    seed = (settings or _settings.current()).seed
    return DEFAULT_SEED if seed is None else seed


def new_seed() -> int:
    """A fresh course seed: random, kept with the instructor's data (never in the package)."""
    import secrets

    return secrets.randbelow(2**61 - 2) + 1


def course_seed(explicit: int | None = None, settings=None) -> int:
    """The seed of a graded deployment (batch, the Gradescope bundle, nbgrader): `explicit`
    (--seed, a course config), else $AUTOGRADER_SEED. The built-in DEFAULT_SEED is refused:
    anyone with the package could compute every hidden input from it (and, with the solutions,
    every expected output). $AUTOGRADER_ALLOW_PUBLIC_SEED=1 accepts it (tests, demonstrations).
    settings: the entry point's (`settings.Settings`; default `settings.current()`)."""
    settings = settings or _settings.current()
    seed = explicit if explicit is not None else settings.seed
    if settings.allow_public_seed:
        return DEFAULT_SEED if seed is None else seed
    if seed is None or seed == DEFAULT_SEED:
        raise PublicSeed("no course seed: the built-in seed is public, so the hidden inputs would not be "
                         "hidden. Make one once per course (`python -m autograder new-seed`), keep it with the "
                         "course's private data, and pass it with --seed or $AUTOGRADER_SEED")
    return seed


def generator(seed: int, *salt: str) -> torch.Generator:
    """A generator whose stream depends on the seed and on a name (chapter, exercise)."""
    h = seed
    for s in salt:
        for ch in s:
            h = (h * 1000003 + ord(ch)) % (2**61 - 1)
    return torch.Generator().manual_seed(h)


def randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def bool_mask(gen: torch.Generator, *shape: int, p: float = 0.3, full_rows: int = 1) -> torch.Tensor:
    """A boolean mask (True = attend) of `shape` (..., L_q, L_k), about p of entries masked out,
    with `full_rows` query rows (counted over the flattened batch) fully masked."""
    mask = torch.rand(shape, generator=gen) >= p
    if full_rows and len(shape) >= 2:
        flat = mask.reshape(-1, shape[-2], shape[-1])
        for i in range(min(full_rows, flat.shape[0])):
            flat[i, int(torch.randint(shape[-2], (1,), generator=gen)), :] = False
        mask = flat.reshape(shape)
    return mask


def float_mask(gen: torch.Generator, *shape: int, p: float = 0.3, full_rows: int = 0) -> torch.Tensor:
    """An additive float mask: 0 or -inf where masked, plus a small random bias elsewhere."""
    keep = bool_mask(gen, *shape, p=p, full_rows=full_rows)
    bias = randn(gen, *shape, scale=0.5)
    return torch.where(keep, bias, torch.full_like(bias, float("-inf")))


def distinct_state(module: torch.nn.Module, gen: torch.Generator, scale: float = 0.5) -> dict:
    """Fresh random values for every parameter of `module`, distinct per parameter (so a swapped
    layer shows), as plain CPU float64 tensors keyed like its state_dict (buffers excluded)."""
    return {name: randn(gen, *p.shape, scale=scale / max(1, p.shape[-1]) ** 0.5 if p.dim() > 1 else scale)
            for name, p in module.named_parameters()}
