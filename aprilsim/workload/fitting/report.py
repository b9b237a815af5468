"""`FitReport`: what `aprilsim fit` found, as a terminal table, a JSON-ready dict and a model
file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprilsim._version import __version__
from aprilsim.workload.fitting.censoring import percent
from aprilsim.workload.fitting.data import LengthData
from aprilsim.workload.fitting.drift_fit import DriftFitter
from aprilsim.workload.fitting.errors import LengthDataError
from aprilsim.workload.fitting.fitter import LengthFitter
from aprilsim.workload.fitting.prompt_split import PromptSplit
from aprilsim.workload.fitting.quantiles import capped_share
from aprilsim.workload.lengths import LengthModel
from aprilsim.workload.model_file import ModelFile, write_model_file

FEW_LENGTHS = 50  # below this, warn that the fit is rough


def _num(x: float) -> str:
    if x != x:  # nan
        return "nan"
    if abs(x) >= 1e5:
        return f"{x:,.0f}"
    return f"{x:.4g}" if abs(x) < 100 else f"{x:,.1f}"


@dataclass
class FitReport:
    """The result of `fit_log`. `fitter` is None for a mean-length curve (drift only)."""

    data: LengthData
    fitter: LengthFitter | None = None
    model: LengthModel | None = None
    prompt_split: PromptSplit | None = None
    drift: DriftFitter | None = None
    drift_source: str | None = None

    # ------------------------------------------------------------------ dict / JSON
    def to_dict(self) -> dict[str, Any]:
        d = self.data
        out: dict[str, Any] = {
            "source": d.source,
            "column": d.column,
            "group_column": d.group_column,
            "step_column": d.step_column,
            "rows_read": d.rows_read,
            "rows_skipped": d.skipped,
            "rows_skipped_examples": d.skip_examples,
        }
        if self.fitter is not None:
            out.update(self.fitter.to_dict())
            out["observed_capped_share"] = self.fitter.cap_.share
            out["data_outside_interval"] = self.outside()
            if self.model is not None and self.model is not self.fitter.model_:
                out["model_at_step0"] = self.model.to_dict()
            out["warnings"] = self.warnings()
        else:
            out["n"] = d.n
            out["note"] = "one row per step: a mean-length curve; only the drift was fitted"
        if self.prompt_split is not None:
            out["prompt_split"] = self.prompt_split.to_dict()
        if self.drift is not None:
            out["drift"] = {**self.drift.to_dict(), "source": self.drift_source or "step column"}
        return out

    # ------------------------------------------------------------------ terminal
    def table(self) -> str:
        d = self.data
        skipped = (
            "; skipped " + ", ".join(f"{v:,} {k}" for k, v in d.skipped.items())
            if d.skipped
            else ""
        )
        lines = [
            f"{d.source}: column {d.column!r}, {d.n:,} lengths from {d.rows_read:,} rows{skipped}"
        ]
        f = self.fitter
        if f is not None:
            lines.append(f.cap_.explain())
            if f.data_.binned:
                lines.append(
                    f"{len(f.histogram_.values):,} distinct lengths merged into "
                    f"{len(f.data_.values):,} bins (lengths up to {f.data_.exact_up_to:,} kept "
                    "exact, geometric bins above)"
                )
            key = f.criterion
            best = f.results_[0]
            hdr = (f"{'rank':>4} {'family':<19} {'k':>4} {'loglik':>12} {'AIC':>12} {'BIC':>12} "
                   f"{'d' + key.upper():>9} {'KS':>7} {'AD':>9}")
            lines += ["", hdr]
            for i, r in enumerate(f.results_, 1):
                delta = getattr(r, key) - getattr(best, key)
                flag = "" if r.converged else "  (not converged)"
                lines.append(
                    f"{i:>4} {r.family:<19} {r.n_params:>4} {r.loglik:>12.1f} {r.aic:>12.1f} "
                    f"{r.bic:>12.1f} {delta:>9.1f} {r.ks:>7.4f} {_num(r.ad):>9}{flag}"
                )
            for name, why in f.failed_.items():
                lines.append(f"   - {name:<19} failed: {why}")
            lines += ["", f"chosen: {best.family} (lowest {key.upper()}): {self._model_str()}"]
            lines.append("  " + self._quantile_line())
        else:
            lines.append("one row per step: a mean-length curve; only the drift is fitted")
        if self.prompt_split is not None:
            p = self.prompt_split
            lines.append(
                f"prompt split: {p.n_groups_:,} prompts, {p.mean_group_size_:.1f} samples each; "
                f"prompt_share {p.share_:.3f} [{p.ci_[0]:.3f}, {p.ci_[1]:.3f}] "
                f"(log-length variance between {p.between_var_:.3f}, within {p.within_var_:.3f})"
            )
        if self.drift is not None:
            dr = self.drift
            src = (
                f" from {self.drift_source}"
                if self.drift_source not in (None, "step column")
                else ""
            )
            lines.append(
                f"drift{src}: steps {dr.steps_[0]:,.0f}-{dr.steps_[-1]:,.0f}, linear slope "
                f"{dr.linear_.slope:.3g}/step (R^2 {dr.r2_:.3f}, mean {dr.m0_:,.0f} at step 0); "
                f"using the {dr.kind_} form; trust it up to step {dr.extrapolate_to_:,.0f}"
            )
        return "\n".join(lines)

    def _quantile_line(self) -> str:
        """Model quantiles and capped share with intervals, each beside the data's own value;
        a data value outside the model's interval is flagged (a tail misfit shows)."""
        f = self.fitter
        assert f is not None
        bs = f.bootstrap_
        parts = []
        for q, v in f.quantiles_.items():
            ci = bs.get(q)
            emp = f.empirical_quantiles_.get(q)
            s = f"{q} {v:,.0f}"
            if ci:
                s += f" [{ci['lo']:,.0f}, {ci['hi']:,.0f}]"
            s += f" (data {emp:,.0f}"
            if ci and emp is not None and not ci["lo"] <= emp <= ci["hi"]:
                s += ", OUTSIDE the interval"
            parts.append(s + ")")
        if f.max_len_ is not None:
            c = bs.get("capped_share")
            model_share = c["estimate"] if c else capped_share(f.model_, f.max_len_)
            s = f"capped {percent(model_share)} %"
            if c:
                s += f" [{percent(c['lo'])}, {percent(c['hi'])}]"
            s += f" (data {percent(f.cap_.share)} %"
            if c and not c["lo"] <= f.cap_.share <= c["hi"]:
                s += ", OUTSIDE the interval"
            parts.append(s + ")")
        note = (
            f"{int(100 * f.confidence)} % bootstrap, {f.n_bootstrap} resamples"
            if bs
            else "no bootstrap"
        )
        return "; ".join(parts) + f"  ({note})"

    def outside(self) -> dict[str, bool]:
        """For each bootstrapped statistic: is the data's own value outside the interval?"""
        f = self.fitter
        if f is None:
            return {}
        observed = {**f.empirical_quantiles_, "capped_share": f.cap_.share}
        return {
            k: not ci["lo"] <= observed[k] <= ci["hi"]
            for k, ci in f.bootstrap_.items()
            if k in observed and ci["n"] > 0
        }

    def warnings(self) -> list[str]:
        """What a user should not miss: too few lengths for a trustworthy fit."""
        out = []
        if self.fitter is not None and self.data.n < FEW_LENGTHS:
            out.append(
                f"only {self.data.n} lengths: the ranking and intervals are rough; "
                f"fit at least {FEW_LENGTHS} for a usable model"
            )
        return out

    def _model_str(self) -> str:
        assert self.model is not None
        d = self.model.to_dict()
        if d["family"] == "empirical":
            return f"{len(d['values'])} quantile points"
        return ", ".join(
            f"{k}={[round(x, 4) for x in v] if isinstance(v, list) else round(v, 4)}"
            for k, v in d.items()
            if k != "family"
        )

    # ------------------------------------------------------------------ model file
    def model_file(self) -> ModelFile:
        f = self.fitter
        if f is None or self.model is None:
            raise LengthDataError(
                f"{self.data.source} is a mean-length curve (one row per step), not per-sample "
                "lengths: fit a per-sample log and add this curve with --drift-from"
            )
        best = f.results_[0]
        fit: dict[str, Any] = {
            "tool": f"aprilsim {__version__} fit",
            "source": self.data.source,
            "column": self.data.column,
            "n": f.n_samples_,
            "rows_skipped": self.data.n_skipped,
            "family": best.family,
            "criterion": f.criterion,
            "ranking": [r.family for r in f.results_],
            "loglik": best.loglik,
            "aic": best.aic,
            "bic": best.bic,
            "ks": best.ks,
            "ad": best.ad,
            "cap_source": f.cap_.source,
            "n_censored": f.cap_.n_censored,
        }
        for q, v in f.quantiles_.items():
            fit[q] = v
            if q in f.bootstrap_:
                fit[f"{q}_ci"] = [f.bootstrap_[q]["lo"], f.bootstrap_[q]["hi"]]
        if "capped_share" in f.bootstrap_:
            fit["capped_share"] = f.bootstrap_["capped_share"]["estimate"]
            fit["capped_share_ci"] = [
                f.bootstrap_["capped_share"]["lo"],
                f.bootstrap_["capped_share"]["hi"],
            ]
        if self.prompt_split is not None:
            fit["prompt_share_ci"] = list(self.prompt_split.ci_)
            fit["prompt_groups"] = self.prompt_split.n_groups_
        if self.drift is not None:
            fit["drift_source"] = self.drift_source or "step column"
            fit["drift_r2_linear"] = self.drift.r2_
            fit["drift_extrapolate_to"] = self.drift.extrapolate_to_
        return ModelFile(
            lengths=self.model,
            max_len=f.max_len_,
            prompt_share=None if self.prompt_split is None else min(self.prompt_split.share_, 0.99),
            drift=None if self.drift is None else self.drift.drift_,
            fit=fit,
        )

    def write_model(self, path: str | Path) -> None:
        """Write the model file a scenario references with `lengths = { from = "..." }`."""
        write_model_file(path, self.model_file())

    def plot(self, path: str | Path) -> Path:
        """Write the fit figure; returns the file written (`.png` appended to a bare name)."""
        from aprilsim.workload.fitting.plots import plot_report

        return plot_report(self, path)
