"""Scenario fuzz: 550 mutated scenario files through `aprilsim simulate`, in-process.

Each case is a tiny valid scenario with one or two mutations from one category, drawn by a seeded
generator (the same 550 files on every run; `set_override` cases also pass hostile `--set
KEY=VALUE`). `simulate FILE --json` runs through click's CliRunner under a per-case wall-clock
bound; every case must end in one of two ways:

- exit 2 with one line `aprilsim: error: ...` (bad input, said why), or
- exit 0 with a JSON row per scheduler that trained samples (never a table of zeros).

A traceback, any other exit code, a case over its time bound, exit 0 with zero trained samples,
or exit 0 for a value of the wrong type (the string "5" or `false` where a number was, a
non-finite or mistyped scheduler knob: a silent coercion) fails the test. Reach is counted per
category and asserted: every category is drawn often, the categories that keep a scenario valid
reach exit 0 and the ones that break it reach exit 2.
"""

from __future__ import annotations

import copy
import json
import math
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aprilsim.cli import main
from aprilsim.policies.registry import REGISTRY, knobs

CASES = 550
CASE_BOUND_S = 20.0  # per case; the tiny valid scenarios finish in well under a second

BASE: dict[str, Any] = {
    "name": "fuzz",
    "seed": 0,
    "steps": 2,
    "warmup_steps": 0,
    "batch_size": 2,
    "group_size": 2,
    "max_response_len": 256,
    "compare": ["sync"],
    "cluster": {"engines": 1},
    "trainer": {"base_s": 1.0, "per_token_s": 1e-5, "sync_s": 0.5},
    "lengths": {"family": "lognormal", "mu": 4.0, "sigma": 0.5},
    "prompts": {"family": "lognormal", "mu": 3.0, "sigma": 0.3, "max_len": 64},
    "workload": {"prompt_share": 0.3, "rewards": {"alpha": 1.0, "beta": 1.0}},
}

EXTREME = [0, -1, 1, 2**31, 2**63 - 1, 10**18, 1e7, 1e9, 1e18, 1e308, -1e308, math.inf,
           -math.inf, math.nan, 0.5, -0.5, 2.5, 1e-300]
WRONG_TYPES = ["false", "true", "no", "", "1e3", "inf", "nan", "fifo", [1, 2], [], {"a": 1},
               True, False, "1", "/etc"]
PATHS = ["/etc", "/dev/zero", "/dev/null", "/nonexistent/model.toml", "/proc/self/status",
         "fuzz_dir", "binary.toml", "empty.toml", "deep.toml", "huge.toml"]
CATEGORIES = ("wrong_type", "extreme_number", "unknown_key", "delete_key", "scheduler_knob",
              "deep_nesting", "bad_path", "toml_text", "compare_list", "valid_variation",
              "set_override")
VALID_SETS = ["cluster.engines=3", "schedulers.april.ratio=1.5", "steps=3", "seed=7",
              "lengths.sigma=0.8"]
SET_VALUES = ["1e400", "-1e400", "NaN", "[1, 2]", "{}", '"x"', "true", "false", "0", "-1", "3",
              "0.5", "1e18", "9223372036854775807", "fifo", "", "[[[[1]]]]", "2.5"]


def _value(v: Any) -> str:
    """One TOML value (inf and nan included, which TOML allows)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v)
                else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"


def dumps(d: dict[str, Any]) -> str:
    """A scenario dict as TOML: top-level scalars first, then one table per dict."""
    lines = [f"{json.dumps(k)} = {_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    lines += [f"{json.dumps(k)} = {_value(v)}" for k, v in d.items() if isinstance(v, dict)]
    return "\n".join(lines) + "\n"


def _leaves(d: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _leaves(v, (*prefix, k))
        else:
            out.append((*prefix, k))
    return out


MUST_FAIL = {"last": False}  # whether the case `_mutate` made last must be refused


def _get(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    for k in path:
        d = d[k]
    return d


def _same_kind(old: Any, new: Any) -> bool:
    """An int where a float was, or a float where a float was, is no wrong type."""
    num = (int, float)
    return (isinstance(old, bool) == isinstance(new, bool)
            and (type(old) is type(new) or (isinstance(old, float) and isinstance(new, num))))


def _set(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _knob_space() -> list[tuple[str, str, Any]]:
    return [(name, k.name, k.default) for name, cls in sorted(REGISTRY.items()) for k in knobs(cls)]


def _set_args(rng: random.Random) -> list[str]:
    """`--set KEY=VALUE` arguments: scenario keys and scheduler knobs with hostile values."""
    keys = [".".join(p) for p in _leaves(BASE)]
    keys += [f"schedulers.{n}.{k}" for n, k, _ in _knob_space()]
    keys += ["lengths.mus.1", "cluster.nope", "prompts", "schedulers.april", "compare.0"]
    args = []
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.2:  # a valid override beside the hostile ones: exit 0 stays reached
            args += ["--set", rng.choice(VALID_SETS)]  # (whatever the knob count drawn from)
        else:
            args += ["--set", f"{rng.choice(keys)}={rng.choice(SET_VALUES)}"]
    return args


def _mutate(rng: random.Random, category: str,
            tmp: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(scenario dict, None) or (None, raw TOML text) for one case of `category`."""
    d = copy.deepcopy(BASE)
    leaves = _leaves(BASE)
    MUST_FAIL["last"] = False
    if category == "set_override":
        d["compare"] = ["sync", "april"]
    elif category == "wrong_type":
        path, value = rng.choice(leaves), rng.choice(WRONG_TYPES)
        _set(d, path, value)
        old = _get(BASE, path)
        MUST_FAIL["last"] = not _same_kind(old, value)  # a string, bool or list where a number was
    elif category == "extreme_number":
        for _ in range(rng.randint(1, 2)):
            _set(d, rng.choice(leaves), rng.choice(EXTREME))
    elif category == "unknown_key":
        path = rng.choice(leaves)
        typo = path[-1][:-1] + rng.choice("xyz_") if len(path[-1]) > 1 else "zz"
        _set(d, (*path[:-1], rng.choice([typo, "extra", "Steps", path[-1].upper()])), 1)
    elif category == "delete_key":
        path = rng.choice(leaves)
        cur = d
        for k in path[:-1]:
            cur = cur[k]
        del cur[path[-1]]
        if rng.random() < 0.3:
            d.pop(path[0], None)  # the whole table
    elif category == "scheduler_knob":
        name, knob, default = rng.choice(_knob_space())
        d["compare"] = [name]
        r = rng.random()
        if r < 0.3:
            value = default if default is not None else 2
        elif r < 0.6:
            value = rng.choice(EXTREME)
        else:
            value = rng.choice(WRONG_TYPES)
        d["schedulers"] = {name: {knob: value}}
        non_finite = isinstance(value, float) and not math.isfinite(value)
        MUST_FAIL["last"] = non_finite or (default is not None and not _same_kind(default, value))
    elif category == "deep_nesting":
        depth = rng.choice([10, 65, 200, 500, 2000])
        open_, close = rng.choice([("{a=", "}"), ("[", "]")])
        key = rng.choice(["x", "lengths", "schedulers"])
        return None, dumps(d) + f"\n{key}_deep = {open_ * depth}1{close * depth}\n"
    elif category == "bad_path":
        target = rng.choice(PATHS)
        p = target if target.startswith("/") else str(tmp / target)
        if rng.random() < 0.5:
            d["lengths"] = {"from": p}
        else:
            d["cluster"]["preset"] = p if p.endswith(".toml") else p + "/x.toml"
    elif category == "toml_text":
        text = dumps(d)
        cut = rng.randrange(len(text))
        op = rng.choice(["truncate", "garbage", "duplicate", "bytes"])
        if op == "truncate":
            text = text[:cut]
        elif op == "garbage":
            text = (text[:cut] + rng.choice(["=", "[[", "\"", "]]", "= =", "\\u0000", "é\n"])
                    + text[cut:])
        elif op == "duplicate":
            line = rng.choice(text.splitlines() or [""])
            text = text + "\n" + line + "\n"
        else:
            text = text[:cut] + "\ud800" + text[cut:]
        return None, text
    elif category == "compare_list":
        names = sorted(REGISTRY)
        d["compare"] = rng.choice([[], ["nope"], ["sync", "sync"], names, ["april", "sink"],
                                   ["my.mod:Cls"], [1], "sync", rng.sample(names, 2)])
    elif category == "valid_variation":
        d["cluster"]["engines"] = rng.randint(1, 3)
        d["batch_size"] = rng.randint(1, 4)
        d["group_size"] = rng.randint(1, 3)
        d["seed"] = rng.randint(0, 10**6)
        d["lengths"]["sigma"] = rng.uniform(0.2, 1.2)
        d["compare"] = rng.sample(["sync", "april", "fully_async", "async_one_step",
                                   "tail_batching"], rng.randint(1, 2))
    return d, None


def _fixtures(tmp: Path) -> None:
    (tmp / "fuzz_dir").mkdir(exist_ok=True)
    (tmp / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (tmp / "empty.toml").write_text("")
    (tmp / "deep.toml").write_text("x = " + "[" * 3000 + "]" * 3000 + "\n")
    (tmp / "huge.toml").write_text("# pad\n" * 3_000_000)


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def test_scenario_fuzz(tmp_path):
    _fixtures(tmp_path)
    rng = random.Random(20261201)
    outcomes: Counter[tuple[str, str]] = Counter()
    reach: Counter[str] = Counter()
    failures: list[str] = []
    runner = CliRunner()
    old = signal.signal(signal.SIGALRM, _on_alarm)
    t_all = time.perf_counter()
    try:
        for i in range(CASES):
            category = CATEGORIES[i % len(CATEGORIES)] if i < 2 * len(CATEGORIES) \
                else rng.choice(CATEGORIES)
            data, text = _mutate(rng, category, tmp_path)
            must_fail = MUST_FAIL["last"]
            if text is None:
                text = dumps(data)
            path = tmp_path / f"case{i}.toml"
            path.write_text(text, errors="surrogateescape") if "\ud800" not in text \
                else path.write_bytes(text.encode("utf-8", "surrogatepass"))
            reach[category] += 1
            extra = _set_args(rng) if category == "set_override" else []
            signal.setitimer(signal.ITIMER_REAL, CASE_BOUND_S)
            t0 = time.perf_counter()
            try:
                r = runner.invoke(main, ["simulate", str(path), "--json", *extra])
            except _Timeout:
                failures.append(f"case {i} ({category}): over {CASE_BOUND_S} s: {text[:200]!r}")
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.perf_counter() - t0
            if isinstance(r.exception, _Timeout):
                failures.append(f"case {i} ({category}): over {CASE_BOUND_S} s: {text[:200]!r}")
                continue
            if r.exception is not None and not isinstance(r.exception, SystemExit):
                failures.append(f"case {i} ({category}): traceback {r.exception!r}: "
                                f"{extra} {text[:300]!r}")
                continue
            if r.exit_code == 2:
                lines = r.stderr.strip().splitlines()
                if len(lines) != 1 or not lines[0].startswith("aprilsim: error: "):
                    failures.append(f"case {i} ({category}): exit 2 not one error line: {lines!r}")
                outcomes[(category, "refused")] += 1
            elif r.exit_code == 0:
                if must_fail:  # a wrong type silently coerced (the string "5", false as 0)
                    failures.append(f"case {i} ({category}): a wrong type ran: {text[:300]!r}")
                rows = json.loads(r.stdout)
                if not rows or any(row["trained_samples"] <= 0 for row in rows):
                    failures.append(f"case {i} ({category}): exit 0 with zero trained samples")
                outcomes[(category, "ran")] += 1
            else:
                failures.append(f"case {i} ({category}): exit {r.exit_code}: {r.output[-300:]!r}")
            if took > CASE_BOUND_S:
                failures.append(f"case {i} ({category}): took {took:.1f} s")
    finally:
        signal.signal(signal.SIGALRM, old)
    wall = time.perf_counter() - t_all
    print(f"\nscenario fuzz: {CASES} cases in {wall:.1f} s")
    for c in CATEGORIES:
        print(f"  {c:<16} {reach[c]:>4} cases: {outcomes[(c, 'ran')]:>4} ran, "
              f"{outcomes[(c, 'refused')]:>4} refused (exit 2)")
    assert not failures, "\n".join(failures[:20])
    assert sum(reach.values()) == CASES >= 500
    assert all(reach[c] >= 30 for c in CATEGORIES), reach
    # the categories that keep a scenario valid run; the ones that break it are refused
    assert outcomes[("valid_variation", "ran")] == reach["valid_variation"]
    for c in ("wrong_type", "extreme_number", "unknown_key", "deep_nesting", "bad_path",
              "toml_text", "compare_list", "scheduler_knob", "set_override"):
        assert outcomes[(c, "refused")] >= 10, (c, outcomes)
    for c in ("scheduler_knob", "extreme_number", "delete_key", "set_override"):
        assert outcomes[(c, "ran")] >= 3, (c, outcomes)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-s", "-q"])
