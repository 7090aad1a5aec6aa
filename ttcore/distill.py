"""Distilling a sampler into fewer steps: a student whose one step learns k steps of a teacher.

A student of K steps (the log-linear schedule, random order) starts its step j (0-based) from a state x_t with
``masked_at(l, K, j)`` positions still masked and commits the positions that take it to the next boundary. A
teacher of k * K steps started from x_t commits, in its first k steps, the same number of positions (its counts
are the schedule's over the steps left: ``teacher_completion``). Its k-step completion (the set T it committed
and the tokens x_T) is one sample of the teacher's k-step law of (T, x_T) given x_t; the student is fitted to
it by an objective (``OBJECTIVES``):

- ``joint``: -log p_student(x_T | x_t), the exact log-likelihood of the student's own step on T, the other
  masked positions summed out as the served step sums them (``Decomposition.chosen_log_prob``): a CP or TT
  student learns the teacher's k-step joint over T, correlations included, which a factorized (rank-1) student
  cannot represent. Its minimizer is the teacher's k-step law (``tests/distill``).
- ``marginal``: sum over T of -log p_student(x^i | x_t), the student's exact single-position marginals (Eqs.
  14-17): a per-position fit to the teacher's k-step marginals (the cross-entropy to its samples), SDTT's kind
  of target (Deschenaux & Gulcehre 2025), the rank-1 baseline; for a rank-1 student it equals ``joint``.

States x_t (``STATES``): by default the student's own, where its first j steps lead (on-policy, as DAgger: the
teacher's k steps show how to go on from the student's own partial samples, which is where few steps go wrong);
or the teacher's; or the data's, masked at a student step boundary (a uniformly random set of the boundary's
size: the student's random order), which is close to the maximum likelihood the student was trained with and
moves it little (QM9 TT r = 16, 1,200 steps: K = 4 validity 53.6% against the teacher's 53.1%). Every random
number comes from a ``torch.Generator`` the recipe owns (j, the data states) or from counter-based streams keyed
by ``seed`` (the rollouts' and the teacher's draws), so a resumed run is exact."""

import torch

from ttcore.sampling import GenerationRun, SamplerConfig, batch_step


def masked_at(length: int, steps: int, j: int) -> int:
    """Positions still masked at the start of step j (0-based) of a ``steps``-step log-linear run over a fully
    masked sequence of ``length`` (``schedules.unmask_counts``: round(n f(t)), f(t) = t)."""
    return round(length * (1 - j / steps))


def student_states(x0: torch.Tensor, steps: int, mask_id: int, generator: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence of ``x0`` [b, l] at a student step boundary: a step j uniform in [0, steps) and a uniformly
    random set of ``masked_at(l, steps, j)`` positions masked. -> (x_t [b, l], j [b])."""
    b, l = x0.shape
    j = torch.randint(0, steps, (b,), generator=generator, device=x0.device)
    n = torch.tensor([masked_at(l, steps, int(i)) for i in j], device=x0.device)
    order = torch.rand(b, l, generator=generator, device=x0.device).argsort(1)  # a random order per sequence
    rank = order.argsort(1)
    return torch.where(rank < n[:, None], torch.full_like(x0, mask_id), x0), j


@torch.no_grad()
def _step_groups(model, j: torch.Tensor, make_run, target, out: torch.Tensor) -> torch.Tensor:
    """For each distinct j, the run ``make_run(jj, rows)`` of its rows, stepped until ``target(jj)`` steps of its
    schedule are taken (steps that unmask nothing skipped; all runs together, one backbone call a step, in eval
    mode); its tokens written into ``out``'s rows. -> out."""
    groups = [(j == jj).nonzero()[:, 0] for jj in j.unique().tolist()]
    runs = [(rows, make_run(jj, rows), target(jj)) for rows, jj in zip(groups, j.unique().tolist())]

    def live() -> list:
        going = []
        for _, run, stop in runs:
            if not run.done and run.step_index < stop:
                run.skip_idle_steps()
                if not run.done and run.step_index < stop:
                    going.append(run)
        return going

    was_training = model.training
    model.eval()
    try:
        with model.compute_context():
            while going := live():
                batch_step(model, going)
    finally:
        model.train(was_training)
    for rows, run, _ in runs:
        out[rows] = run.tokens
    return out


def rollout_states(model, b: int, steps: int, j: torch.Tensor, config: SamplerConfig, seed: int, device
                   ) -> torch.Tensor:
    """States a ``steps``-step run of ``model`` reaches from a fully masked start: row i after its first j[i]
    steps, the draws keyed by ``seed`` + j. -> x_t [b, l]."""
    out = torch.full((b, model.cfg.dit.length), model.cfg.dit.vocab_size - 1, dtype=torch.long, device=device)
    return _step_groups(model, j, lambda jj, rows: GenerationRun(model, len(rows), steps, config, seed=seed + jj,
                                                                 device=device), lambda jj: jj, out)


STATES = ("student", "teacher", "data")  # where a batch's x_t come from (``distill_loss``)


def teacher_completion(teacher, x_t: torch.Tensor, j: torch.Tensor, steps: int, k: int, config: SamplerConfig,
                       seed: int) -> torch.Tensor:
    """The teacher's first k steps of a k * (steps - j)-step run from each x_t, its draws keyed by ``seed`` + j.
    -> the tokens after them [b, l] (``x_t`` where nothing was committed)."""
    return _step_groups(teacher, j, lambda jj, rows: GenerationRun(
        teacher, len(rows), k * (steps - jj), config, seed=seed + jj, prompt=x_t[rows], device=x_t.device),
        lambda jj: k, x_t.clone())


def step_log_prob(model, x_t: torch.Tensor, chosen: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log p_model(x_T | x_t) of one step of ``model`` committing x [b, l] at ``chosen`` [b, l]
    (``Decomposition.chosen_log_prob``). -> [b]."""
    mask_id = model.cfg.dit.vocab_size - 1
    h = model.features(x_t)
    return model.format.chosen_log_prob(model.head, h, x_t == mask_id, chosen, x)


def joint_objective(model, x_t: torch.Tensor, chosen: torch.Tensor, x: torch.Tensor) -> dict:
    """-log p(x_T | x_t) per committed token (a ratio of batch totals), plus a TT's L_C (Eq. 19) on T (the
    contracted-core head tracks the cores as they move)."""
    mask_id = model.cfg.dit.vocab_size - 1
    h = model.features(x_t)
    nll = -model.format.chosen_log_prob(model.head, h, x_t == mask_id, chosen, x).sum() / chosen.sum().clamp_min(1)
    lc = _lc(model, h, chosen)
    return {"loss": nll + lc, "nll": nll.detach(), "lc": lc.detach()}


def marginal_objective(model, x_t: torch.Tensor, chosen: torch.Tensor, x: torch.Tensor) -> dict:
    """sum_{i in T} -log p(x^i | x_t) per committed token, each position by the student's exact single-position
    marginal (``Decomposition.marginals_at``, the served step's contraction); a TT's L_C as in ``joint``."""
    mask_id = model.cfg.dit.vocab_size - 1
    h = model.features(x_t)
    p = model.format.marginals_at(model.head, h, x_t == mask_id, chosen, 1.0, "head")  # [m, v] float64
    picked = p.gather(1, x[chosen][:, None]).squeeze(1)
    nll = -picked.clamp_min(torch.finfo(p.dtype).tiny).log().sum() / chosen.sum().clamp_min(1)
    lc = _lc(model, h, chosen)
    return {"loss": nll + lc, "nll": nll.detach().float(), "lc": lc.detach()}


def _lc(model, h: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The format's extra term on T (``HeadOutputs.auxiliary_loss``: TT's L_C, Eq. 19; zero otherwise)."""
    return model.format.outputs(model.head, h, chosen).auxiliary_loss()


OBJECTIVES = {"joint": joint_objective, "marginal": marginal_objective}


def distill_loss(student, teacher, x0: torch.Tensor, *, steps: int, k: int, objective: str,
                 teacher_config: SamplerConfig, generator: torch.Generator, seed: int, states: str = "student") -> dict:
    """One batch: states at the student's step boundaries, the teacher's k-step completions from them
    (``teacher_completion``), the objective on what the teacher committed. ``states``: ``student`` (on-policy:
    where the student's own first j steps lead, ``rollout_states``: the teacher shows how to go on from the
    student's own mistakes), ``teacher`` (where the teacher's first k j steps lead) or ``data`` (the data masked
    at the boundary, ``student_states``: close to the MLE the student was trained with). -> the objective's dict
    plus ``committed`` (tokens the teacher committed, the batch's)."""
    mask_id = student.cfg.dit.vocab_size - 1
    b = len(x0)
    if states == "data":
        x_t, j = student_states(x0, steps, mask_id, generator)
    else:
        j = torch.randint(0, steps, (b,), generator=generator, device=x0.device)
        x_t = rollout_states(student, b, steps, j, SamplerConfig(), seed + 7919, x0.device) if states == "student" \
            else rollout_states(teacher, b, k * steps, j * k, teacher_config, seed + 7919, x0.device)
    done = teacher_completion(teacher, x_t, j, steps, k, teacher_config, seed)
    chosen = (x_t == mask_id) & (done != mask_id)
    out = OBJECTIVES[objective](student, x_t, chosen, done)
    out["committed"] = chosen.sum()
    return out
