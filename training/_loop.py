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
from ttcore.losses import mdlm_loss, vadd_loss
from ttcore.models import JointModel, load_train_state, save_checkpoint
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
        title: str = "ttcore model", quiet: bool = False, fit_minutes: float | None = None) -> dict:
    """Train ``model`` until ``max_steps`` (default cfg.total_steps) or ``max_minutes``; checkpoint to ``out``.
    ``fit_minutes``: size the run to that much training time on this device: after ``PROBE_STEPS`` steps (past
    the first, which compiles and warms up) the measured seconds per step give the steps that fit, printed
    before the run goes on; they become ``max_steps`` and the cosine schedule's length, and the run is then
    budgeted by those steps.
    Under torchrun, data-parallel across the processes (``ttcore.parallel``): the same global batches, process 0
    writes."""
    if getattr(model, "latent_dim", 0) and cfg.marginal_weight:
        raise ValueError("marginal_weight is not applied to VADD models (Eq. 21 has no marginal-consistency "
                         "term here): leave it at 0 for a model with a latent")
    device = pick_device(cfg.device)
    workers = Workers.from_env(device)
    workers.check_batch(cfg.batch_size)
    device = workers.device(device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model.to(device).train()
    workers.broadcast_parameters(model)
    if cfg.compile:
        model.backbone.compile()  # in place: parameter names (and checkpoints) are unchanged
    params = [p for p in model.parameters() if p.requires_grad]
    backbone = [p for p in model.backbone.parameters() if p.requires_grad]
    in_backbone = {id(p) for p in backbone}
    groups = [{"params": backbone, "lr_scale": 1.0},
              {"params": [p for p in params if id(p) not in in_backbone], "lr_scale": cfg.head_lr_ratio}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(0.9, cfg.beta2),
                            weight_decay=cfg.weight_decay, fused=device.type == "cuda")  # one kernel on CUDA
    if device.type == "cuda":  # the split lives on the device: a step indexes it there, no host copy per batch
        train_tokens = train_tokens.to(device)
    gen = torch.Generator(device).manual_seed(cfg.seed + RESEED_STRIDE * workers.rank)  # masks differ per process
    order = BatchOrder(len(train_tokens), cfg.batch_size, cfg.seed)
    meta = {"step": 0, "wall_seconds": 0.0, "commands": [], "val": {}, "device": str(device)}
    saved = load_train_state(out) if resume and Path(out).exists() else None
    if saved is not None:
        tensors, meta = saved
        load_optimizer_state(opt, tensors, meta.pop("optimizer"))
        # every process's mask stream continues where it stopped when the run resumes on as many processes;
        # on another number of processes (or a checkpoint without them) the others reseed from (seed, rank, step)
        own = "rng.generator" if workers.main else f"rng.generator.{workers.rank}"
        if own in tensors and meta.get("processes", 1) == workers.world:
            restore_generator(gen, tensors[own], meta, cfg.seed)
        else:
            gen.manual_seed(cfg.seed + RESEED_STRIDE * (meta["step"] + workers.rank * 1_000_003))
            meta.setdefault("reseeded", []).append({"step": meta["step"], "processes": workers.world})
        torch.set_rng_state(tensors["rng.torch"])
        meta["device"] = str(device)
        order = BatchOrder(len(train_tokens), cfg.batch_size, cfg.seed, meta["epoch"], meta["index"])
    # EMA: the checkpoint's model weights are the average (what validation, export and serving see); the
    # optimizer's own weights travel in the train state as raw.<name>
    ema = WeightEMA(model, cfg.ema_decay, meta.get("ema_updates", 0)) if cfg.ema_decay > 0 else None
    if saved is not None and ema is not None and any(k.startswith("raw.") for k in tensors):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if f"raw.{n}" in tensors:
                    p.copy_(tensors[f"raw.{n}"].to(p))
    meta["commands"] = meta["commands"] + [public_command([Path(sys.executable).name] + sys.argv)]
    mask_id = tokenizer.mask_id
    steps_asked = max_steps is not None  # fit_minutes caps an explicit --max-steps, else replaces the config's
    max_steps = cfg.total_steps if max_steps is None else max_steps
    flops_per_token = train_flops_per_token(model)  # MFU: model FLOPs against the device's peak (ttcore.flops)
    peak, peak_source = device_peak(device, cfg.precision)
    run_tokens, run_train_s = 0, 0.0  # this run's training steps only (no validation, checkpoint or data setup)
    start_time, start_wall, last_ckpt = time.time(), meta["wall_seconds"], time.time()
    meta.pop("stopped_early", None)  # this run's own stop decides

    def validate():
        nonlocal t0
        started = time.time()
        try:
            return _validate()
        finally:
            t0 += time.time() - started  # the interval's throughput counts training steps only

    def _validate():
        with ema.applied(model) if ema is not None else contextlib.nullcontext():
            return evaluate_loss(model, val_tokens, mask_id, batch_size=cfg.batch_size, batches=cfg.val_batches,
                                 precision=cfg.precision, eps=cfg.eps, device=device, kl_weight=cfg.kl_weight)

    def checkpoint():
        """Called by every process (they exchange their mask streams' states); process 0 writes."""
        nonlocal t0
        started = time.time()
        try:
            _checkpoint()
        finally:
            t0 += time.time() - started

    def _checkpoint():
        states = workers.gather_states(gen.get_state())
        if not workers.main:
            return
        meta["processes"] = workers.world
        meta["wall_seconds"] = start_wall + time.time() - start_time
        meta["seconds_per_step"] = meta["wall_seconds"] / max(1, meta["step"])
        meta["epoch"], meta["index"] = order.epoch, order.index
        meta["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if run_train_s > 0:  # this run's (a resumed run reports its own part)
            rate = run_tokens / run_train_s
            meta["throughput"] = {"tokens_per_second": rate, "mfu": mfu(rate / workers.world, flops_per_token, peak),
                                  "flops_per_token": flops_per_token, "peak_flops": peak, "peak": peak_source,
                                  "processes": workers.world}
        opt_tensors, opt_meta = optimizer_state(opt)
        tensors = dict(opt_tensors, **{"rng.generator": states[0], "rng.torch": torch.get_rng_state()},
                       **{f"rng.generator.{rank}": state for rank, state in enumerate(states) if rank})
        if ema is not None:
            meta["ema_updates"] = ema.updates
        with ema.applied(model) if ema is not None else contextlib.nullcontext() as raw:
            tensors.update({f"raw.{n}": v for n, v in (raw or {}).items()})
            save_checkpoint(out, model, tokenizer, model_card=model_card(title, cfg, model, meta),
                            train_state=(tensors, dict(meta, optimizer=opt_meta, config=asdict(cfg))),
                            train_config=asdict(cfg))

    quiet = quiet or not workers.main
    start_step, probe_t0 = meta["step"], time.time()
    tokens_per_step = cfg.batch_size * train_tokens.shape[1]
    bar = tqdm(total=max_steps, initial=meta["step"], disable=quiet, dynamic_ncols=True, mininterval=5)
    tokens_seen, t0 = 0, time.time()
    stop = _StopOnSignal()  # SIGTERM / SIGINT: finish the step, checkpoint, return
    while meta["step"] < max_steps:
        out_of_time = max_minutes is not None and time.time() - start_time > 60 * max_minutes
        due = workers.main and meta["step"] > 0 and time.time() - last_ckpt > 60 * cfg.ckpt_minutes
        # every process stops, and checkpoints, on the same step (process 0's clock decides when one is due)
        stop_now, checkpoint_now = workers.any_of([out_of_time or stop.requested, due], device)
        if checkpoint_now:
            checkpoint()
            last_ckpt = time.time()
        if stop_now:  # the budget is steps; wall time and signals are safety stops, and the card says so
            meta["stopped_early"] = {"step": meta["step"], "of": max_steps,
                                     "by": "max_minutes" if out_of_time else "signal"}
            break
        step = meta["step"]
        for group in opt.param_groups:
            group["lr"] = group["lr_scale"] * lr_at(step, cfg.lr, cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio)
        x0 = train_tokens[workers.share(order.next())].to(device)
        with autocast(device, cfg.precision):
            if model.latent_dim:
                losses = vadd_loss(model, x0, mask_id, cfg.kl_weight, cfg.eps, generator=gen)
            else:
                losses = mdlm_loss(model, x0, mask_id, cfg.eps, generator=gen, marginal_weight=cfg.marginal_weight,
                                   processes=workers)
        opt.zero_grad(set_to_none=True)
        losses["loss"].backward()
        workers.average_gradients(params)  # the global batch's mean gradient on every process
        if step < cfg.freeze_backbone_steps:  # no gradient: AdamW leaves these weights and their moments alone
            for p in backbone:
                p.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        if ema is not None:
            ema.update(model)
        meta["step"] = step + 1
        tokens_seen += x0.numel() * workers.world
        if meta["step"] % cfg.log_every == 0 or meta["step"] == max_steps:
            loss_text = f"{losses['nll'].item():.4f}"  # .item(): the interval's steps are done (CUDA too)
            interval = time.time() - t0
            rate = tokens_seen / interval
            run_tokens, run_train_s = run_tokens + tokens_seen, run_train_s + interval
            bar.set_postfix(loss=loss_text, lc=f"{losses['lc'].item():.2e}", gn=f"{grad_norm.item():.2f}",
                            lr=f"{opt.param_groups[0]['lr']:.2e}", tok_s=f"{rate:.0f}",
                            mfu=f"{100 * mfu(rate / workers.world, flops_per_token, peak):.1f}%")
            tokens_seen, t0 = 0, time.time()
        bar.update(1)
        if fit_minutes is not None and meta["step"] - start_step == PROBE_STEPS + 1:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            per_step = (time.time() - probe_t0) / PROBE_STEPS
            fitted = start_step + max(PROBE_STEPS + 1, int(60 * fit_minutes / per_step))
            fitted = int(workers.all_sum(torch.tensor(fitted, device=device)).item()) // workers.world
            max_steps = cfg.total_steps = min(max_steps, fitted) if steps_asked else fitted
            bar.total = max_steps
            if workers.main:
                print(f"fit {fit_minutes:g} minutes: {per_step:.3f} s/step measured over {PROBE_STEPS} steps "
                      f"({tokens_per_step / per_step:,.0f} tokens/s): {max_steps} steps", flush=True)
        if fit_minutes is not None and meta["step"] - start_step == 1:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            probe_t0 = time.time()
        if not workers.main:
            continue  # process 0 validates and checkpoints; the others meet it at the next all-reduce
        if meta["step"] % cfg.val_every == 0 or meta["step"] == max_steps:
            meta["val"] = validate()
            if not quiet:
                bar.write(f"step {meta['step']}: val " + " ".join(f"{k} {v:.4f}" for k, v in meta["val"].items()))
    bar.close()
    stop.restore()
    workers.check_replicas(model)
    if workers.main and not meta["val"]:
        meta["val"] = validate()
    checkpoint()
    workers.close()
    return meta
