"""What a recipe writes for people: the model card, its validation and throughput lines, the command."""

import json
import shlex
from dataclasses import asdict
from pathlib import Path

from ttcore.models import JointModel

from .config import TrainConfig


def public_command(argv: list[str]) -> str:
    """The command line as cards record it: absolute paths under the working directory made relative,
    any other absolute path cut to its last component (``.../name``), so a card never tells where the
    trainer's files were."""
    cwd = Path.cwd()
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=") if arg.startswith("--") or "=" in arg else ("", "", arg)
        if value.startswith("/"):
            p = Path(value)
            value = str(p.relative_to(cwd)) if p.is_relative_to(cwd) else f".../{p.name}"
        out.append(key + eq + value)
    return shlex.join(out)


def validation_summary(val: dict) -> str:
    """One line for model cards and logs; the names are those of ``evaluate_loss``."""
    nan = float("nan")
    if set(val) == {"nll"}:  # a kind with an exact likelihood: autoregressive, block diffusion (``evaluate_loss``)
        return (f"-log p(x) {val['nll']:.4f} nats per position (exact, padding included; "
                f"comparable with a diffusion model's NELBO)")
    if "kl" in val:
        return (f"joint NLL given z ~ r_phi {val['nll']:.4f} nats per masked token, KL(r_phi || p(z)) "
                f"{val['kl']:.4f} nats per sequence, Eq. 21 objective {val['objective']:.4f} nats per token (VADD)")
    return (f"joint NLL {val.get('nll', nan):.4f} nats per masked token (the training objective), "
            f"marginal NLL {val.get('marginal_nll', nan):.4f} per masked token, "
            f"NELBO {val.get('nelbo', nan):.4f} nats per position (bound from the exact marginals, padding "
            f"included)")


def throughput_line(t: dict) -> str:
    """The run's speed as cards and the recipes' last line give it (``ttcore.flops``)."""
    return (f"- throughput: {t['tokens_per_second']:,.0f} tokens/s in training steps ({t['processes']} "
            f"process{'es' if t['processes'] > 1 else ''}), MFU {100 * t['mfu']:.1f}% of {t['peak']} "
            f"({t['peak_flops'] / 1e12:.3g} TFLOP/s; {t['flops_per_token'] / 1e6:.3g} MFLOP a token: 6N plus "
            f"attention)")


def _stopped_early(stop: dict) -> str:
    by = "the wall-clock safety stop (--max-minutes)" if stop["by"] == "max_minutes" else "a signal"
    return (f"- stopped early: at step {stop['step']} of the {stop['of']} asked, by {by}; a comparison at an equal "
            "budget needs equal steps")


def model_card(title: str, cfg: TrainConfig, model: JointModel, meta: dict) -> str:
    n_params = sum(p.numel() for p in model.parameters())
    lines = [f"# {title}", "", f"- decomposition: {model.cfg.decomposition}, rank {model.cfg.rank}, "
             f"head {model.cfg.head_label}",
             f"- parameters: {n_params / 1e6:.2f}M; length {model.cfg.dit.length}, vocab {model.cfg.dit.out_vocab}",
             f"- data: {cfg.data.source} ({cfg.data.tokenizer} tokenizer, validation fraction {cfg.data.val_fraction}, "
             f"split seed 0; family {cfg.data.family}, metrics {cfg.data.metrics})",
             f"- steps: {meta['step']}, wall time {meta['wall_seconds'] / 3600:.2f} h "
             f"({meta['seconds_per_step']:.3f} s/step, batch {cfg.batch_size}, {meta['device']})",
             *([_stopped_early(meta["stopped_early"])] if meta.get("stopped_early") else []),
             *([throughput_line(meta["throughput"])] if meta.get("throughput") else []),
             "- validation: " + validation_summary(meta["val"]),
             *([f"- weights: the EMA of the training weights (decay {cfg.ema_decay:g}, {meta.get('ema_updates', 0)} "
                f"updates); validation uses them too"] if cfg.ema_decay > 0 else []),
             "", "## Commands", "", *[f"    {c}" for c in meta["commands"]],
             "", "## Config", "", "```json", json.dumps(asdict(cfg), indent=1), "```", ""]
    return "\n".join(lines)
