"""The training loop of the recipes (``pretrain.py``, ``finetune.py``): they build a model and call ``fit``,
which assembles the library's parts (``ttcore.recipes``: config, schedule, data order, EMA, checkpoint
state, validation, cards). A run writes an atomic checkpoint every ``ckpt_minutes`` and at the end;
``resume`` continues exactly (model, optimizer, LR schedule position, every process's mask stream, step, data
position) when it runs on as many processes as wrote the checkpoint (on another number, the mask streams
reseed from (seed, rank, step) and the state records it). Under torchrun, data-parallel across the processes
(``ttcore.parallel``)."""

import contextlib
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from ttcore.flops import device_peak, mfu, train_flops_per_token
from ttcore.losses import forward_mask, mdlm_loss, sample_times, vadd_loss
from ttcore.models import JointModel, load_train_state, save_checkpoint
from ttcore.models.precision import resolve_precision
from ttcore.parallel import Workers
from ttcore.recipes import (
    RESEED_STRIDE,
    BatchOrder,
    TrainConfig,
    WeightEMA,
    autocast,
    evaluate_loss,
    load_optimizer_state,
    lr_at,
    model_card,
    optimizer_state,
    pick_device,
    public_command,
    restore_generator,
)

PROBE_STEPS = 10  # fit_minutes: the steps timed to size the run


class _WholeBatch:
    """``mdlm_loss``'s ``processes`` for a micro-batch: the whole batch's masked count (all processes') as the
    normalizer, and the number of processes whose gradients are averaged."""

    def __init__(self, world: int, n_masked: torch.Tensor):
        self.world, self.n_masked = world, n_masked

    def all_sum(self, _share: torch.Tensor) -> torch.Tensor:
        return self.n_masked


class _StopOnSignal:
    """Turns SIGTERM / SIGINT into a request to stop after the current step (main thread only)."""

    def __init__(self):
        self.requested = False
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def restore(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def fit(model: JointModel, tokenizer, train_tokens: torch.Tensor, val_tokens: torch.Tensor, cfg: TrainConfig,
        out: str | Path, *, resume: bool = False, max_steps: int | None = None, max_minutes: float | None = None,
        title: str = "ttcore model", quiet: bool = False, fit_minutes: float | None = None,
        objective=None) -> dict:
    """Train ``model`` until ``max_steps`` (default cfg.total_steps) or ``max_minutes``; checkpoint to ``out``.
    ``fit_minutes``: size the run to that much training time on this device: after ``PROBE_STEPS`` steps (past
    the first, which compiles and warms up) the measured seconds per step give the steps that fit, printed
    before the run goes on; they become ``max_steps`` and the cosine schedule's length, and the run is then
    budgeted by those steps.
    Under torchrun, data-parallel across the processes (``ttcore.parallel``): the same global batches, process 0
    writes. ``objective``: replaces MDLM's loss (``distill.py``; by default the model kind's when it has one,
    ``ModelKind.objective``): ``objective(model, x0, generator, step)`` ->
    a dict with ``loss`` (differentiated), ``nll`` and ``lc`` (logged), drawing its randomness from
    ``generator`` (the run's mask stream: a resumed run continues it) and ``step``."""
    if getattr(model, "latent_dim", 0) and cfg.marginal_weight:
        raise ValueError("marginal_weight is not applied to VADD models (Eq. 21 has no marginal-consistency "
                         "term here): leave it at 0 for a model with a latent")
    run = _Run(model, tokenizer, train_tokens, val_tokens, cfg, Path(out), title)
    run.objective = objective or model.cfg.kind.objective(model.cfg, tokenizer.mask_id, cfg.eps)  # None: MDLM's
    if resume and Path(out).exists():
        run.resume()
    run.meta["commands"] = run.meta["commands"] + [public_command([Path(sys.executable).name] + sys.argv)]
    run.meta.pop("stopped_early", None)  # this run's own stop decides
    return run.train(cfg.total_steps if max_steps is None else max_steps, max_steps is not None, max_minutes,
                     quiet, fit_minutes)


class _Run:
    """One ``fit``: the model on its device, its optimizer, mask stream, data order, EMA and the state a
    checkpoint carries (``meta``); the loop and its pieces are methods."""

    def __init__(self, model, tokenizer, train_tokens, val_tokens, cfg: TrainConfig, out: Path, title: str):
        self.model, self.tokenizer, self.val_tokens, self.cfg, self.out, self.title = (
            model, tokenizer, val_tokens, cfg, out, title)
        self.objective = None  # MDLM's loss unless ``fit`` was given another
        device = pick_device(cfg.device)
        self.workers = workers = Workers.from_env(device)
        workers.check_batch(cfg.batch_size)
        self.device = device = workers.device(device)
        cfg.precision = resolve_precision(cfg.precision, device)  # auto: what this device runs natively
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        model.to(device).train()
        workers.broadcast_parameters(model)
        if cfg.activation_checkpointing:
            model.backbone.checkpointing_()
        if cfg.compile:
            model.backbone.compile()  # in place: parameter names (and checkpoints) are unchanged
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.backbone = [p for p in model.backbone.parameters() if p.requires_grad]
        in_backbone = {id(p) for p in self.backbone}
        groups = [{"params": self.backbone, "lr_scale": 1.0},
                  {"params": [p for p in self.params if id(p) not in in_backbone], "lr_scale": cfg.head_lr_ratio}]
        self.opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(0.9, cfg.beta2),
                                     weight_decay=cfg.weight_decay, fused=device.type == "cuda")  # one CUDA kernel
        if device.type == "cuda":  # the split lives on the device: a step indexes it there, no host copy per batch
            train_tokens = train_tokens.to(device)
        self.train_tokens = train_tokens
        self.gen = torch.Generator(device).manual_seed(cfg.seed + RESEED_STRIDE * workers.rank)  # per process
        self.order = BatchOrder(len(train_tokens), cfg.batch_size, cfg.seed, device=train_tokens.device)
        self.meta = {"step": 0, "wall_seconds": 0.0, "commands": [], "val": {}, "device": str(device)}
        # EMA: the checkpoint's model weights are the average (what validation, export and serving see); the
        # optimizer's own weights travel in the train state as raw.<name>
        self.ema = WeightEMA(model, cfg.ema_decay) if cfg.ema_decay > 0 else None
        self.flops_per_token = train_flops_per_token(model)  # MFU: model FLOPs against the peak (ttcore.flops)
        self.peak, self.peak_source = device_peak(device, cfg.precision)
        self.run_tokens, self.run_train_s = 0, 0.0  # this run's training steps only (no validation or saving)
        self.start_time, self.start_wall = time.time(), 0.0
        self.t0 = time.time()  # the start of the current logging interval
        # the first step whose loss was not finite (-1: none), kept on the device: checked (one sync) where the
        # loop logs or checkpoints, so no weights trained on a NaN are ever written
        self.bad_step = torch.full((), -1, dtype=torch.long, device=device)

    def resume(self) -> None:
        """Continue from the checkpoint's train state, if it has one."""
        saved = load_train_state(self.out)
        if saved is None:
            return
        cfg, workers = self.cfg, self.workers
        tensors, meta = saved
        self.meta = meta
        load_optimizer_state(self.opt, tensors, meta.pop("optimizer"))
        # every process's mask stream continues where it stopped when the run resumes on as many processes;
        # on another number of processes (or a checkpoint without them) the others reseed from (seed, rank, step)
        own = "rng.generator" if workers.main else f"rng.generator.{workers.rank}"
        if own in tensors and meta.get("processes", 1) == workers.world:
            restore_generator(self.gen, tensors[own], meta, cfg.seed)
        else:
            self.gen.manual_seed(cfg.seed + RESEED_STRIDE * (meta["step"] + workers.rank * 1_000_003))
            meta.setdefault("reseeded", []).append({"step": meta["step"], "processes": workers.world})
        torch.set_rng_state(tensors["rng.torch"])
        meta["device"] = str(self.device)
        self.order = BatchOrder(len(self.train_tokens), cfg.batch_size, cfg.seed, meta["epoch"], meta["index"],
                                device=self.train_tokens.device)
        self.start_wall = meta["wall_seconds"]
        if self.ema is not None:
            self.ema.updates = meta.get("ema_updates", 0)
            if any(k.startswith("raw.") for k in tensors):
                with torch.no_grad():
                    for n, p in self.model.named_parameters():
                        if f"raw.{n}" in tensors:
                            p.copy_(tensors[f"raw.{n}"].to(p))

    def _weights_for_reading(self):
        return self.ema.applied(self.model) if self.ema is not None else contextlib.nullcontext()

    def validate(self) -> dict:
        """``evaluate_loss`` on the validation split (the EMA weights when kept); its time is not training's."""
        self.check_finite()
        started, cfg = time.time(), self.cfg
        try:
            with self._weights_for_reading():
                return evaluate_loss(self.model, self.val_tokens, self.tokenizer.mask_id, batch_size=cfg.batch_size,
                                     batches=cfg.val_batches, precision=cfg.precision, eps=cfg.eps,
                                     device=self.device, kl_weight=cfg.kl_weight)
        finally:
            self.t0 += time.time() - started  # the interval's throughput counts training steps only

    def check_finite(self) -> None:
        """Stop the run with a clear error once a step's loss was not finite: its gradient made every weight
        after it meaningless, so nothing after it is validated, logged as progress or written."""
        bad = int(self.bad_step)
        if bad >= 0:
            last = self.out / "train_state" / "state.json"
            kept = f"the last checkpoint ({last}) is kept as it was" if last.exists() else "no checkpoint was written"
            raise SystemExit(f"{self.title}: the loss was not finite (NaN or inf) at step {bad + 1}; training stopped "
                             f"and {kept}. Lower lr, check the data and the model's inputs (a pretrained masked LM "
                             "fed inputs it was not built for), or run in fp32 (--set precision=fp32).")

    def checkpoint(self) -> None:
        """Called by every process (they exchange their mask streams' states); process 0 writes."""
        self.check_finite()
        started = time.time()
        try:
            self._checkpoint()
        finally:
            self.t0 += time.time() - started

    def _checkpoint(self) -> None:
        workers, meta, cfg = self.workers, self.meta, self.cfg
        states = workers.gather_states(self.gen.get_state())
        if not workers.main:
            return
        meta["processes"] = workers.world
        meta["wall_seconds"] = self.start_wall + time.time() - self.start_time
        meta["seconds_per_step"] = meta["wall_seconds"] / max(1, meta["step"])
        meta["epoch"], meta["index"] = self.order.epoch, self.order.index
        meta["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if self.run_train_s > 0:  # this run's (a resumed run reports its own part)
            rate = self.run_tokens / self.run_train_s
            meta["throughput"] = {"tokens_per_second": rate, "train_seconds": self.run_train_s,
                                  "flops_per_token": self.flops_per_token,
                                  "mfu": mfu(rate / workers.world, self.flops_per_token, self.peak),
                                  "mfu_counts": "one plain training step (a forward and backward) per token",
                                  "peak_flops": self.peak, "peak": self.peak_source, "processes": workers.world}
        opt_tensors, opt_meta = optimizer_state(self.opt)
        tensors = dict(opt_tensors, **{"rng.generator": states[0], "rng.torch": torch.get_rng_state()},
                       **{f"rng.generator.{rank}": state for rank, state in enumerate(states) if rank})
        if self.ema is not None:
            meta["ema_updates"] = self.ema.updates
        with self._weights_for_reading() as raw:
            tensors.update({f"raw.{n}": v for n, v in (raw or {}).items()})
            save_checkpoint(self.out, self.model, self.tokenizer,
                            model_card=model_card(self.title, cfg, self.model, meta),
                            train_state=(tensors, dict(meta, optimizer=opt_meta, config=asdict(cfg))),
                            train_config=asdict(cfg))

    def step(self, step: int) -> tuple[dict, torch.Tensor, int]:
        """One optimizer step on the next global batch. -> (losses, gradient norm, tokens in the global batch)."""
        cfg, model, workers = self.cfg, self.model, self.workers
        for group in self.opt.param_groups:
            group["lr"] = group["lr_scale"] * lr_at(step, cfg.lr, cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio)
        x0 = self.train_tokens[workers.share(self.order.next())].to(self.device)
        self.opt.zero_grad(set_to_none=True)
        losses = self._backward(x0)
        self.bad_step = torch.where((self.bad_step < 0) & ~torch.isfinite(losses["loss"].detach()), step,
                                    self.bad_step)
        workers.average_gradients(self.params)  # the global batch's mean gradient on every process
        if step < cfg.freeze_backbone_steps:  # no gradient: AdamW leaves these weights and their moments alone
            for p in self.backbone:
                p.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        if self.ema is not None:
            self.ema.update(model)
        return losses, grad_norm, x0.numel() * workers.world

    def _backward(self, x0: torch.Tensor) -> dict:
        """The batch's loss and its gradient (``backward``), in ``grad_accum`` micro-batches: the times and masks
        are drawn for the whole batch first (as one piece draws them) and every piece is normalized by the whole
        batch's masked count (``mdlm_loss``'s shares), so the summed gradient is the one-piece gradient (without
        dropout: with it, each piece draws its own dropout masks), up to
        float rounding. VADD's Eq. 21 is normalized by rows (b * l): each piece weighs its rows."""
        cfg, model, workers, mask_id = self.cfg, self.model, self.workers, self.tokenizer.mask_id
        if self.objective is not None:  # a recipe's own loss (each process its share, its gradient averaged)
            with autocast(self.device, cfg.precision):
                losses = self.objective(model, x0, self.gen, self.meta["step"])
            losses["loss"].backward()
            return losses
        k = cfg.grad_accum
        if len(x0) % k:
            raise ValueError(f"grad_accum {k} must divide this process's share of the batch ({len(x0)} sequences)")
        if model.latent_dim:
            parts = []
            for piece in x0.chunk(k):
                with autocast(self.device, cfg.precision):
                    out = vadd_loss(model, piece, mask_id, cfg.kl_weight, cfg.eps, generator=self.gen)
                (out["loss"] * len(piece) / len(x0)).backward()
                parts.append(out)
            return {key: sum(p[key].detach() for p in parts) / k for key in parts[0]}
        shares = workers if workers.world > 1 else None
        if k == 1:
            with autocast(self.device, cfg.precision):
                losses = mdlm_loss(model, x0, mask_id, cfg.eps, generator=self.gen,
                                   marginal_weight=cfg.marginal_weight, processes=shares)
            losses["loss"].backward()
            return losses
        t = sample_times(len(x0), cfg.eps, x0.device, self.gen)
        _, mask = forward_mask(x0, t, mask_id, self.gen)
        n_local = mask.sum().float()
        whole = _WholeBatch(workers.world, workers.all_sum(n_local.clone()) if shares is not None else n_local)
        totals, rows = {}, torch.arange(len(x0), device=x0.device)
        for idx in rows.chunk(k):
            with autocast(self.device, cfg.precision):
                out = mdlm_loss(model, x0[idx], mask_id, cfg.eps, t=t[idx], mask=mask[idx],
                                marginal_weight=cfg.marginal_weight, processes=whole)
            out["loss"].backward()
            totals["loss"] = totals.get("loss", 0) + out["loss"].detach()  # the pieces' shares of the objective
            n_piece = mask[idx].sum()
            for key in ("nll", "lc", "marginal_nll"):  # per masked token: the pieces weighed by their counts
                totals[key] = totals.get(key, 0) + out[key] * n_piece / n_local.clamp_min(1)
            totals["nelbo"] = totals.get("nelbo", 0) + out["nelbo"] * len(idx) / len(x0)  # per position
        return totals

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self, max_steps: int, steps_asked: bool, max_minutes: float | None, quiet: bool,
              fit_minutes: float | None) -> dict:
        """The loop: steps until ``max_steps`` (``fit_minutes`` may resize it after its probe; ``steps_asked``:
        it then caps an explicit ``--max-steps`` rather than replacing the config's), safety stops, the
        interval logs, validation and checkpoints; then the last validation and checkpoint. -> ``meta``."""
        cfg, workers, meta = self.cfg, self.workers, self.meta
        quiet = quiet or not workers.main
        start_step, probe_t0, last_ckpt = meta["step"], time.time(), time.time()
        tokens_per_step = cfg.batch_size * self.train_tokens.shape[1]
        bar = tqdm(total=max_steps, initial=meta["step"], disable=quiet, dynamic_ncols=True, mininterval=5)
        tokens_seen, self.t0 = 0, time.time()
        stop = _StopOnSignal()  # SIGTERM / SIGINT: finish the step, checkpoint, return
        while meta["step"] < max_steps:
            out_of_time = max_minutes is not None and time.time() - self.start_time > 60 * max_minutes
            due = workers.main and meta["step"] > 0 and time.time() - last_ckpt > 60 * cfg.ckpt_minutes
            # every process stops, and checkpoints, on the same step (process 0's clock decides when one is due)
            stop_now, checkpoint_now = workers.any_of([out_of_time or stop.requested, due], self.device)
            if checkpoint_now:
                self.checkpoint()
                last_ckpt = time.time()
            if stop_now:  # the budget is steps; wall time and signals are safety stops, and the card says so
                meta["stopped_early"] = {"step": meta["step"], "of": max_steps,
                                         "by": "max_minutes" if out_of_time else "signal"}
                break
            losses, grad_norm, tokens = self.step(meta["step"])
            meta["step"] += 1
            tokens_seen += tokens
            if meta["step"] % cfg.log_every == 0 or meta["step"] == max_steps:
                self._log(bar, losses, grad_norm, tokens_seen)
                tokens_seen = 0
            bar.update(1)
            if fit_minutes is not None and meta["step"] - start_step == PROBE_STEPS + 1:
                self._sync()
                per_step = (time.time() - probe_t0) / PROBE_STEPS
                max_steps = self._fitted(start_step, per_step, fit_minutes, max_steps, steps_asked, tokens_per_step)
                bar.total = max_steps
            if fit_minutes is not None and meta["step"] - start_step == 1:
                self._sync()
                probe_t0 = time.time()
            if not workers.main:
                continue  # process 0 validates and checkpoints; the others meet it at the next all-reduce
            if meta["step"] % cfg.val_every == 0 or meta["step"] == max_steps:
                meta["val"] = self.validate()
                if not quiet:
                    bar.write(f"step {meta['step']}: val " + " ".join(f"{k} {v:.4f}" for k, v in meta["val"].items()))
        bar.close()
        stop.restore()
        workers.check_replicas(self.model)
        if workers.main and not meta["val"]:
            meta["val"] = self.validate()
        self.checkpoint()
        workers.close()
        return meta

    def _log(self, bar, losses: dict, grad_norm: torch.Tensor, tokens_seen: int) -> None:
        """The interval's loss, speed and MFU on the progress bar; the interval ends here."""
        self.check_finite()
        loss_text = f"{losses['nll'].item():.4f}"  # .item(): the interval's steps are done (CUDA too)
        interval = time.time() - self.t0
        rate = tokens_seen / interval
        self.run_tokens, self.run_train_s = self.run_tokens + tokens_seen, self.run_train_s + interval
        bar.set_postfix(loss=loss_text, lc=f"{losses['lc'].item():.2e}", gn=f"{grad_norm.item():.2f}",
                        lr=f"{self.opt.param_groups[0]['lr']:.2e}", tok_s=f"{rate:.0f}",
                        mfu=f"{100 * mfu(rate / self.workers.world, self.flops_per_token, self.peak):.1f}%")
        self.t0 = time.time()

    def _fitted(self, start_step: int, per_step: float, fit_minutes: float, max_steps: int, steps_asked: bool,
                tokens_per_step: int) -> int:
        """``fit_minutes``' steps from the probe's seconds per step (agreed by every process), printed."""
        workers = self.workers
        fitted = start_step + max(PROBE_STEPS + 1, int(60 * fit_minutes / per_step))
        fitted = int(workers.all_sum(torch.tensor(fitted, device=self.device)).item()) // workers.world
        max_steps = self.cfg.total_steps = min(max_steps, fitted) if steps_asked else fitted
        if workers.main:
            print(f"fit {fit_minutes:g} minutes: {per_step:.3f} s/step measured over {PROBE_STEPS} steps "
                  f"({tokens_per_step / per_step:,.0f} tokens/s): {max_steps} steps", flush=True)
        return max_steps
