"""Likelihood of each checkpoint on the data it was trained on (its ``train_config.json``), or on ``--data``:
the validation metrics (joint NLL, marginal NLL, NELBO; ``ttcore.recipes.evaluate_loss``), the ELBO perplexity
(the exact perplexity for a kind with an exact likelihood: autoregressive, block diffusion), and, for TT, the
contracted-core head's error against the exact contraction (total variation per row of Gbar_j, mean and max over
masked positions). Any family: no sample metrics needed.

    python training/evaluate_likelihood.py --checkpoints checkpoints --out results/likelihood --cards

Writes ``likelihood.json``; with ``--cards`` the validation line of each model card is replaced.
"""

import argparse
import json
from pathlib import Path

import torch
from _common import dataset
from _report import checkpoint_dirs, data_section, this_command, train_config

from ttcore.decompositions import exact_contracted_cores
from ttcore.losses import forward_mask, sample_times
from ttcore.models import load_for_inference
from ttcore.recipes import evaluate_loss, validation_summary
from ttcore.scoring import elbo


@torch.no_grad()
def contraction_error(model, tokens: torch.Tensor, mask_id: int, seed: int = 1234) -> dict:
    """Total variation between the contracted-core head's Gbar_j and the exact sum_x G_j(x), per row j
    (each row is a distribution over k), on the masked positions of ``tokens`` masked at t ~ U[1e-3, 1].
    -> {"head_tv_mean", "head_tv_max"} over positions (each position's TV averaged over its r rows)."""
    g = torch.Generator(tokens.device).manual_seed(seed)
    t = sample_times(tokens.shape[0], 1e-3, tokens.device, g)
    x_t, mask = forward_mask(tokens, t, mask_id, g)
    with model.compute_context():
        h = model.features(x_t, sigma=t)[mask]  # [m, d]
        head = model.head.contracted_cores(h).double()  # [m, r, r]
        exact = exact_contracted_cores(model.head, h, 1.0)  # the sampler's own exact path
    tv = 0.5 * (head - exact).abs().sum(-1).mean(-1)  # [m]
    return {"head_tv_mean": tv.mean().item(), "head_tv_max": tv.max().item(), "head_tv_positions": len(tv)}


def elbo_perplexity(model, tokenizer, tokens: torch.Tensor, batch: int, device: str, num_mc: int = 4,
                    seed: int = 1234) -> dict:
    """exp of the NELBO per real token of the held-out sequences (``ttcore.scoring.elbo``, the quantity POST
    /score's elbo mode returns: every position's term for a family that pads, the real tokens' for one of
    fixed-length blocks, divided by the real tokens), the mean over sequences, with the standard error of
    that mean (each sequence draws its own times, so the sequences' estimates are independent)."""
    g = torch.Generator(device).manual_seed(seed)
    values = []
    with model.compute_context():
        for s in range(0, len(tokens), batch):
            x0 = tokens[s:s + batch].to(device)
            real = x0 != tokenizer.pad_id if tokenizer.pads else torch.ones_like(x0, dtype=torch.bool)
            mean, _ = elbo(model, x0, num_mc, g, real=real, all_terms=tokenizer.pads)
            values.append(mean)
    v = torch.cat(values)
    stderr = (v.std() / len(v) ** 0.5).item() if len(v) > 1 else float("nan")
    return {"elbo_nll": v.mean().item(), "elbo_stderr": stderr, "elbo_ppl": float(torch.exp(v.mean())),
            "elbo_sequences": len(v), "elbo_draws": num_mc, "elbo_terms": "all" if tokenizer.pads else "real"}


@torch.no_grad()
def exact_perplexity(model, tokenizer, tokens: torch.Tensor, batch: int, device: str) -> dict:
    """exp of the exact -log p(x) per real token of the held-out sequences (``ModelKind.exact_nll``: the AR chain
    rule, or block diffusion's sum over blocks), summed over the sequences before dividing, as ``elbo_perplexity``
    reports a bound for a masked diffusion model; nothing is drawn, so no standard error of draws."""
    nats, real = 0.0, 0
    with model.compute_context():
        for s in range(0, len(tokens), batch):
            x0 = tokens[s:s + batch].to(device)
            nats += model.cfg.kind.exact_nll(model, x0).item() * x0.numel()  # per position -> the batch's total
            real += int((x0 != tokenizer.pad_id).sum()) if tokenizer.pads else x0.numel()
    return {"exact_nll_real": nats / real, "exact_ppl": float(torch.exp(torch.tensor(nats / real))),
            "exact_sequences": len(tokens)}


def evaluate_likelihood(paths: list[Path], precision: str, cards: bool, out: Path, data: str | None,
                        device: str = "cpu") -> list[dict]:
    """Validation metrics on the data each checkpoint was trained on (its card's config), or ``data``."""
    rows = []
    for path in paths:
        model, tok, _ = load_for_inference(path, device, precision)
        cfg = train_config(path)
        cfg.precision = precision
        cfg.data = data_section(data, path)  # its own data, or a file / corpus read as its tokenizer says
        val = torch.from_numpy(dataset(cfg, tok).val_tokens)
        metrics = evaluate_loss(model, val, tok.mask_id, batch_size=cfg.batch_size, batches=cfg.val_batches,
                                precision=precision, eps=cfg.eps, device=torch.device(device))
        summary = validation_summary(metrics)  # of evaluate_loss's names alone
        model.eval()
        held_out = val[: cfg.batch_size * cfg.val_batches]
        if model.cfg.kind.exact_likelihood:  # no bound to estimate: its likelihood itself
            metrics.update(exact_perplexity(model, tok, held_out, cfg.batch_size, device))
        else:
            metrics.update(elbo_perplexity(model, tok, held_out, cfg.batch_size, device))
        if "exact" in model.format.contractions:  # the head's contraction has an error
            metrics.update(contraction_error(model, val[: cfg.batch_size].to(device), tok.mask_id))
        rows.append({"checkpoint": path.name, "decomposition": model.cfg.decomposition, "rank": model.cfg.rank,
                     "precision": precision, "val_batches": cfg.val_batches, "batch_size": cfg.batch_size, **metrics})
        perplexity = (f"exact perplexity {metrics['exact_ppl']:.3f} ({metrics['exact_nll_real']:.4f} nats per real "
                      f"token)" if "exact_ppl" in metrics else
                      f"ELBO perplexity {metrics['elbo_ppl']:.3f} (NELBO {metrics['elbo_nll']:.4f} +- "
                      f"{metrics['elbo_stderr']:.4f} nats per real token)")
        print(f"{path.name:>16}: {summary}; {perplexity}"
              + (f"; head TV mean {metrics['head_tv_mean']:.4f} max {metrics['head_tv_max']:.4f}"
                 if "head_tv_mean" in metrics else ""), flush=True)
        if cards:
            card_path = path / "model_card.md"
            lines = card_path.read_text().split("\n")
            lines = [f"- validation ({precision}, re-measured by `{this_command()}`): {summary}"
                     if line.startswith("- validation") else line for line in lines]
            tmp = card_path.with_suffix(".md.tmp")
            tmp.write_text("\n".join(lines))
            tmp.replace(card_path)
    (out / "likelihood.json").write_text(json.dumps(rows, indent=1))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoints", nargs="+", required=True, help="checkpoint directories, or directories of them")
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", help="a file of sequences to measure on instead of each checkpoint's own data")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--cards", action="store_true", help="replace each model card's validation line")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evaluate_likelihood(checkpoint_dirs(args.checkpoints), args.precision, args.cards, out, args.data, args.device)


if __name__ == "__main__":
    main()
