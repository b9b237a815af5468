"""Nothing measured is lost: ``aprilsim validate`` keeps every finished live run in ``--out``.

``OUT/runs/`` holds ``state.json`` (what this validate is: scenario, schedulers, rounds, seed,
steps, scale, engines, cost source; the engines' limits and the checks once connected) and one
pickle per finished live run (``round<R>-<scheduler>.pkl``, written to a temporary name and
renamed, so a kill never leaves half a file). ``OUT/calibration.toml`` is the cost the simulation
ran, written as soon as it is fitted (``--calibration FILE`` takes it back). ``--resume``
continues a validate whose ``state.json`` matches and runs only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE = "state.json"


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._=-" else "_" for ch in label)


def identity(scenario: Any, specs: list[str], rounds: int, opts: Any) -> dict[str, Any]:
    """What makes two validates the same one (their runs can be pooled)."""
    dump = json.dumps(scenario.model_dump(mode="json", exclude={"base_dir"}), sort_keys=True,
                      default=str)
    t = opts.target
    return {"scenario": scenario.name,
            "scenario_sha": hashlib.sha256(dump.encode()).hexdigest()[:16],
            "schedulers": list(specs), "rounds": rounds, "seed": opts.seed, "steps": opts.steps,
            "scale": opts.scale, "engines": list(t.urls) or f"local {t.local}",
            "calibration": str(opts.calibration) if opts.calibration else None,
            "cross_fit": bool(opts.cross_fit)}


@dataclass
class RunStore:
    """The ``runs`` folder of one validate's ``--out``."""

    out: Path
    key: dict[str, Any] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.out / "runs"

    def begin(self, key: dict[str, Any], resume: bool, force: bool = False) -> int:
        """Start (or, ``resume``, continue) this validate's store; the finished runs it holds.
        ValueError (one line) when ``--resume`` finds nothing or another validate's runs, or when
        finished runs would be overwritten without it (``force``: they are removed, the new
        validate's runs take their names), or when ``out`` holds other files (the rule of
        `aprilsim.outputs.claim_dir`: refused unless ``force``)."""
        self.key = key
        state = self.dir / STATE
        if resume:
            if not state.is_file():
                raise ValueError(f"--resume: {self.dir} holds no interrupted validate")
            old = json.loads(state.read_text())
            diff = [k for k in key if old.get("key", {}).get(k) != key[k]]
            if diff:
                raise ValueError(f"--resume: {self.dir} was written by another validate "
                                 f"(it differs in: {', '.join(diff)})")
            self.setup = old.get("setup", {})
            return len(self._files())
        if not self._files() and not self._nothing_kept():
            from aprilsim.outputs import OutputTaken, claim_dir

            try:
                claim_dir(self.out, "--out", force)
            except OutputTaken as e:
                more = "; --resume continues the validate it holds" if state.is_file() else ""
                raise OutputTaken(f"{e}{more}") from None
        elif force:
            for old in self._files():
                old.unlink()
        if self._files():
            raise ValueError(f"{self.dir} holds {len(self._files())} finished runs of an earlier "
                             "validate: give --resume to continue it, another --out, or --force "
                             "to start over")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._write_state()
        return 0

    def load(self) -> RunStore:
        """This store as ``begin`` left it (its ``state.json``), for the live runs to use."""
        state = self.dir / STATE
        if state.is_file():
            old = json.loads(state.read_text())
            self.key, self.setup = old.get("key", {}), old.get("setup", {})
        return self

    def _nothing_kept(self) -> bool:
        """``out`` holds only a validate's state and no finished run (one that failed before
        its first run: running it again loses nothing)."""
        return (self.out.is_dir() and {p.name for p in self.out.iterdir()} == {"runs"}
                and {p.name for p in self.dir.iterdir()} <= {STATE, STATE + ".tmp"})

    def _files(self) -> list[Path]:
        return sorted(self.dir.glob("round*.pkl")) if self.dir.is_dir() else []

    def _write_state(self) -> None:
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps({"key": self.key, "setup": self.setup}, indent=2, default=str))
        tmp.replace(self.dir / STATE)

    def remember(self, limits: dict[str, Any], what: str, checks: list[str],
                 facts: dict[str, Any] | None = None) -> tuple[dict, str, list]:
        """The engines' limits, description and checks of this validate: the first session's
        (kept in ``state.json``) when resuming, so every run is simulated alike."""
        if not self.setup:
            self.setup = {"limits": limits, "what": what, "checks": checks, "facts": facts or {}}
            self._write_state()
        checks = list(self.setup["checks"])
        if len(self.done()) and not any(c.startswith("resumed") for c in checks):
            checks.append(f"resumed: {len(self.done())} runs of an earlier session; its limits "
                          "and checks kept")
        return dict(self.setup["limits"]), self.setup["what"], checks

    def save(self, outcome: Any) -> Path:
        """One finished live run, atomically."""
        path = self.dir / f"round{outcome.round}-{_safe(outcome.label)}.pkl"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(outcome))
        tmp.replace(path)
        return path

    def done(self) -> dict[tuple[str, int], Any]:
        """The finished runs, by (scheduler, round)."""
        out = {}
        for p in self._files():
            o = pickle.loads(p.read_bytes())
            out[(o.label, o.round)] = o
        return out

    def kept(self) -> str:
        """One line: what is kept where."""
        n = len(self._files())
        return f"{n} finished live run{'s' * (n != 1)} kept in {self.dir}"


def write_calibration(path: Path, cost: Any, source: str, client_overhead_s: float = 0.0) -> None:
    """The cost the simulation ran, as a file ``--calibration`` reads ([cost] a, b, c, p0...)."""
    from aprilsim.engine.calibration.preset import preset_toml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(preset_toml(cost, label="validate", source=source,
                                client_overhead_s=client_overhead_s or None))
