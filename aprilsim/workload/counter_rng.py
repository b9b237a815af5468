"""Counter-based random numbers: a draw is a pure function of (seed, stream, group, sample).

Common random numbers need every group's content to depend only on (seed, group index), never on
how many groups were drawn together or in which order. A sequential generator cannot promise that;
a keyed hash of the indices can. We use the splitmix64 finaliser (a bijective 64-bit mixer that
passes BigCrush as a generator) on a key built from the indices, vectorised with numpy.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 2.0**-53

# streams: one per kind of draw, so adding a draw never shifts another
PROMPT_EFFECT, PROMPT_LEN, PASS_RATE, SAMPLE_EFFECT, REWARD = 1, 2, 3, 4, 5
# an episode's: its number of turns, and per turn its length, tool latency and tool tokens
TURNS, TURN_EFFECT, TOOL_SECONDS, TOOL_TOKENS = 6, 7, 8, 9


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, stream: int, groups: np.ndarray,
             samples: np.ndarray | None = None) -> np.ndarray:
    """Uniforms in (0, 1), one per group (shape of `groups`) or per (group, sample) pair.

    With `samples`, the result has shape (len(groups), len(samples)) and entry [i, j] depends only
    on (seed, stream, groups[i], samples[j]).
    """
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN + np.uint64(stream))
        g = _mix(key ^ _mix(np.asarray(groups, dtype=np.uint64) * _GOLDEN + _GOLDEN))
        if samples is not None:
            s = np.asarray(samples, dtype=np.uint64)
            g = _mix(g[:, None] + (s[None, :] + np.uint64(1)) * _GOLDEN)
    return ((g >> np.uint64(11)).astype(np.float64) + 0.5) * _TO_UNIT


def turn_uniforms(seed: int, stream: int, groups: np.ndarray, samples: np.ndarray,
                  turns: int) -> np.ndarray:
    """Uniforms in (0, 1) of shape (len(groups), len(samples), turns): entry [i, j, k] depends
    only on (seed, stream, groups[i], samples[j], k), so a turn's draw never depends on how
    many turns, samples or groups were drawn with it."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN + np.uint64(stream))
        g = _mix(key ^ _mix(np.asarray(groups, dtype=np.uint64) * _GOLDEN + _GOLDEN))
        s = np.asarray(samples, dtype=np.uint64)
        g = _mix(g[:, None] + (s[None, :] + np.uint64(1)) * _GOLDEN)
        t = np.arange(turns, dtype=np.uint64)
        g = _mix(g[:, :, None] ^ _mix((t[None, None, :] + np.uint64(1)) * _GOLDEN))
    return ((g >> np.uint64(11)).astype(np.float64) + 0.5) * _TO_UNIT


def normals(seed: int, stream: int, groups: np.ndarray,
            samples: np.ndarray | None = None) -> np.ndarray:
    """Standard normals, by the inverse CDF of `uniforms` (same indexing)."""
    from scipy import special  # on first use: the CLI starts without scipy

    return special.ndtri(uniforms(seed, stream, groups, samples))
