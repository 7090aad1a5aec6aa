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
  cannot represent. Its minimizer, for each committed set T, is the teacher's k-step law of x_T given that T
  (``tests/distill``); over T it is the mixture of those, weighed as the student's ordering draws T.
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

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ttcore.models.vadd import prior_sample
from ttcore.registry import Registry
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
    out = torch.full((b, model.cfg.dit.length), model.cfg.dit.mask_id, dtype=torch.long, device=device)
    return _step_groups(model, j, lambda jj, rows: GenerationRun(model, len(rows), steps, config, seed=seed + jj,
                                                                 device=device), lambda jj: jj, out)


def _data_states(student, teacher, x0, steps, k, teacher_config, generator, seed):
    return student_states(x0, steps, student.cfg.dit.mask_id, generator)


def _student_rollout(student, teacher, x0, steps, k, teacher_config, generator, seed):
    j = torch.randint(0, steps, (len(x0),), generator=generator, device=x0.device)
    return rollout_states(student, len(x0), steps, j, SamplerConfig(), seed + 7919, x0.device), j


def _teacher_rollout(student, teacher, x0, steps, k, teacher_config, generator, seed):
    j = torch.randint(0, steps, (len(x0),), generator=generator, device=x0.device)
    return rollout_states(teacher, len(x0), k * steps, j * k, teacher_config, seed + 7919, x0.device), j


# where a batch's x_t come from (``distill_loss``): name -> (draw -> (x_t, j), whether the objective sees x_0)
STATE_SOURCES = {"student": (_student_rollout, False), "teacher": (_teacher_rollout, False),
                 "data": (_data_states, True)}
STATES = tuple(STATE_SOURCES)


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
    mask_id = model.cfg.dit.mask_id
    h = model.features(x_t)
    return model.format.chosen_log_prob(model.head, h, x_t == mask_id, chosen, x)


@dataclass
class Completion:
    """One batch's target: the states x_t [b, l], the teacher's k-step completion ``done`` [b, l] (x_t where it
    committed nothing), T = ``chosen`` [b, l] (masked in x_t, committed in ``done``), the data ``x0`` [b, l] the
    states were masked from (data states; None for rollouts), the teacher, and the recipe's generator."""
    x_t: torch.Tensor
    done: torch.Tensor
    chosen: torch.Tensor
    x0: torch.Tensor | None
    teacher: object
    generator: torch.Generator


def joint_objective(model, c: Completion) -> dict:
    """-log p(x_T | x_t) per committed token (a ratio of batch totals), plus a TT's L_C (Eq. 19) on T (the
    contracted-core head tracks the cores as they move)."""
    mask_id = model.cfg.dit.mask_id
    h = model.features(c.x_t)
    nll = -model.format.chosen_log_prob(model.head, h, c.x_t == mask_id, c.chosen, c.done).sum() \
        / c.chosen.sum().clamp_min(1)
    lc = _lc(model, h, c.chosen)
    return {"loss": nll + lc, "nll": nll.detach(), "lc": lc.detach()}


def marginal_objective(model, c: Completion) -> dict:
    """sum_{i in T} -log p(x^i | x_t) per committed token, each position by the student's exact single-position
    marginal (``Decomposition.marginals_at``, the served step's contraction); a TT's L_C as in ``joint``."""
    mask_id = model.cfg.dit.mask_id
    h = model.features(c.x_t)
    p = model.format.marginals_at(model.head, h, c.x_t == mask_id, c.chosen, 1.0, "head")  # [m, v] float64
    picked = p.gather(1, c.done[c.chosen][:, None]).squeeze(1)
    nll = -picked.clamp_min(torch.finfo(p.dtype).tiny).log().sum() / c.chosen.sum().clamp_min(1)
    lc = _lc(model, h, c.chosen)
    return {"loss": nll + lc, "nll": nll.detach().float(), "lc": lc.detach()}


def _lc(model, h: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The format's extra term on T (``HeadOutputs.auxiliary_loss``: TT's L_C, Eq. 19; zero otherwise)."""
    return model.format.outputs(model.head, h, chosen).auxiliary_loss()


DI4C_LATENTS = 16  # Di4C's mixture components a state (its released code's ``latent_bsize``)
DI4C_ALPHA = 0.1  # the data term's weight at t = 1 (``alpha_const``), times sigmoid(20 (t - 1/2)) (``alpha_t``)


def mixture_student(model, latent_dim: int = 8):
    """Di4C's student from a rank-1 model: the same weights with a latent z ~ N(0, I) (``latent_dim``) entering
    every block's conditioning through a zero-initialized map (``DiT.latent_map``), drawn again at every step
    (``ModelConfig.latent_draw`` = ``step``): p(x | x_t) = E_z prod_i p(x^i | x_t, z), at the start the rank-1
    model itself. -> a new JointModel."""
    from ttcore.models import JointModel, ModelConfig

    if model.cfg.format.joint_head or model.latent_dim or model.cfg.backbone is not None:
        raise ValueError("Di4C's student starts from a rank-1 DiT model without a latent")
    dit = dataclasses.replace(model.cfg.dit, latent_dim=latent_dim)
    cfg = ModelConfig(dit, "none", 1, model.cfg.head, dict(model.cfg.extra), None, "step")
    student = JointModel(cfg).to(next(model.parameters()))
    missing, unexpected = student.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.startswith("backbone.latent_map") for k in missing):
        raise ValueError(f"weights do not fit the mixture student: missing {missing}, unexpected {unexpected}")
    return student


def mixture_log_probs(model, x: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """log p(. | x, z_m) for n draws z_m ~ p(z) a sequence: the components of a mixture student's
    p(x_0 | x) = E_z prod_i p(x_0^i | x, z), estimated by their mean. x [b, l] -> [b, n, l, v] float32."""
    b, l = x.shape
    z = prior_sample(b * n, model.latent_dim, generator, x.device)
    h = model.features(x.repeat_interleave(n, 0), z=z)  # [b n, l, d]
    logits = model.head.component_logits(h.reshape(b * n * l, -1))[:, 0]  # [b n l, v]
    return logits.float().log_softmax(-1).view(b, n, l, -1)


def mixture_terms(log_p: torch.Tensor, masked: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture of n factorized components, log_p [b, n, l, v], over the ``masked`` [b, l] positions M, at
    samples y [b, s, l]: (log p(y_M) [b, s], the mixture estimated by the mean of its components, and
    sum_{i in M} log p^i(y^i) [b, s], each position by the mixture's single-position marginal)."""
    b, n, l, v = log_p.shape
    s = y.shape[1]
    at = log_p[:, None].expand(b, s, n, l, v).gather(-1, y[:, :, None, :, None].expand(b, s, n, l, 1))[..., 0]
    at = at * masked[:, None, None]  # [b, s, n, l]; 0 off M (log 1)
    log_n = math.log(n)
    joint = at.sum(-1).logsumexp(2) - log_n
    marginals = (at.logsumexp(2) - log_n).sum(-1)  # off M: log(n * 1) - log n = 0
    return joint, marginals


def _kl(log_q: torch.Tensor, log_p: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """sum_{i in M} KL(q^i || p^i) of per-position laws [b, l, v] (log q = -inf terms contribute 0). -> [b]."""
    q = log_q.exp()
    kl = (q * (log_q - log_p)).nan_to_num(nan=0.0).sum(-1)  # 0 * (-inf) terms: q = 0 contributes 0
    return (kl * masked).sum(-1)


def teacher_log_marginals(teacher, x_t: torch.Tensor, masked: torch.Tensor, generator: torch.Generator
                          ) -> torch.Tensor:
    """log p_teacher(x^i | x_t) at the ``masked`` positions [m, v] float32: its exact single-position marginals
    (Eqs. 14-17), or for a mixture teacher (a Di4C round's student) the mean of ``DI4C_LATENTS`` components."""
    if teacher.latent_dim:
        log_p = mixture_log_probs(teacher, x_t, DI4C_LATENTS, generator)
        return (log_p.logsumexp(1) - math.log(DI4C_LATENTS))[masked]
    with teacher.compute_context():
        p = teacher.format.marginals_at(teacher.head, teacher.features(x_t), masked, masked, 1.0, "head").clone()
    return p.float().clamp_min(1e-30).log()


def di4c_objective(model, c: Completion) -> dict:
    """Di4C (Hayakawa et al. 2025, "Distillation of Discrete Diffusion through Dimensional Correlations"), as its
    released code (sony/di4c, ``di4c_loss``) computes it, on our step boundaries: a mixture student
    p_s(x_0 | x_t) = E_z prod_i p(x_0^i | x_t, z) (``mixture_student``; ``DI4C_LATENTS`` components a state,
    from one set of draws, the mixture estimated by their mean), fitted on data states (x_0 -> x_t) by
    - the consistency term: the teacher's k steps x_t -> x_s (the step the student takes in one), then the
      student's own mixture at x_s (no gradient) draws x_0 (one draw per component); the student at x_t fits that
      composition: -log p_s(x_0 | x_t) with the control variate of its marginals,
      -log p_s(x_0 | x_t) + sum_i log p_s^i(x_0^i | x_t), plus sum_i KL(q^i || p_s^i(. | x_t)) with q^i the
      composition's own marginals (the point mass of what the teacher committed; the student's mixture marginal
      at x_s elsewhere). On the last step the teacher completes every position and it is -log p_s(x_s | x_t);
    - the data term: alpha(t) [-log p_s(x_0 | x_t) + sum_i log p_s^i(x_0^i | x_t)] on the data itself, plus
      sum_i KL(p_teacher^i(. | x_t) || p_s^i(. | x_t)) to the teacher's marginals, alpha(t) = 0.1 sigmoid(20
      (t - 1/2)) with t the masked share (its ``alpha_t = sigmoid``, ``alpha_const = 0.1``);
    all over the positions masked in x_t, normalized per masked token (a ratio of batch totals; Di4C's code
    averages per-sequence sums: the same objective up to a constant factor). Where ours differs from the code: z
    is a Gaussian vector through the blocks' conditioning (VADD's path here; theirs a uniform scalar through an
    extra token) and the times are our step boundaries, so its small-t distillation branch is the last step's
    consistency term (the teacher's completion itself)."""
    if c.x0 is None:
        raise ValueError("the di4c objective fits data states (--states data): its data term needs x_0")
    mask_id = model.cfg.dit.mask_id
    masked = c.x_t == mask_id
    n = DI4C_LATENTS
    log_p = mixture_log_probs(model, c.x_t, n, c.generator)  # [b, n, l, v], differentiable
    log_mix = log_p.logsumexp(1) - math.log(n)  # [b, l, v]: the mixture's single-position marginals
    with torch.no_grad():
        was_training = model.training
        model.eval()
        try:
            log_s = mixture_log_probs(model, c.done, n, c.generator)  # the student at x_s
        finally:
            model.train(was_training)
        still = c.done == mask_id  # [b, l]: what the teacher left masked
        u = torch.rand(*log_s.shape[:3], 1, generator=c.generator, device=log_s.device)
        drawn = (log_s.exp().cumsum(-1) < u).sum(-1).clamp_max(log_s.shape[-1] - 1)  # [b, n, l]
        y = torch.where(still[:, None], drawn, c.done[:, None])  # [b, n, l]: the composition's draws
        point = torch.full_like(log_mix, -math.inf).scatter(-1, c.done.clamp_max(log_mix.shape[-1] - 1)[..., None],
                                                             0.0)
        log_q = torch.where(still[..., None], log_s.logsumexp(1) - math.log(n), point)
        log_t = torch.full_like(log_mix, -math.inf)
        log_t[masked] = teacher_log_marginals(c.teacher, c.x_t, masked, c.generator)
    joint, marginals = mixture_terms(log_p, masked, y)
    consistency = (marginals - joint).mean(1) + _kl(log_q, log_mix, masked)  # [b]
    joint0, marginals0 = mixture_terms(log_p, masked, c.x0[:, None])
    t = masked.float().mean(1)
    alpha = DI4C_ALPHA * torch.sigmoid(20 * (t - 0.5))
    data = alpha * (marginals0 - joint0)[:, 0] + _kl(log_t, log_mix, masked)
    tokens = masked.sum().clamp_min(1)
    loss = (consistency + data).sum() / tokens
    # "nll": minus the log of the components' mean likelihood of the data, a Monte Carlo estimate of the mixture's
    # NLL biased upward (E log mean <= log E: Jensen), per masked token; not the exact NLL
    return {"loss": loss, "nll": (-joint0.sum() / tokens).detach(), "lc": loss.new_zeros(()),
            "consistency": (consistency.sum() / tokens).detach(), "data": (data.sum() / tokens).detach()}


@dataclass(frozen=True)
class Objective:
    """A distillation objective: its loss on a teacher's completion and what a recipe needs to know of it."""
    name: str
    loss: Callable[[object, Completion], dict]  # (student, completion) -> {loss, nll, lc, ...}
    states: tuple[str, ...] = STATES  # the states (``STATES``) it fits: di4c's data term needs x_0, so data only
    grows: bool = True  # a CP / TT student may be grown to a rank (``--student-rank``)
    student: Callable | None = None  # (start checkpoint's model, latent_dim) -> its student; None: the start itself
    teacher_passes: int = 0  # teacher forward passes a batch beyond the k of its completion
    student_passes: int = 1  # student forward passes a batch

    def check(self, states: str, grown: bool) -> None:
        """Raise ValueError, naming the recipe's flag, for states or a grown rank this objective cannot fit."""
        if states not in self.states:
            raise ValueError(f"--objective {self.name} fits --states {' or '.join(self.states)}, got {states!r}")
        if grown and not self.grows:
            raise ValueError(f"--student-rank grows a CP / TT student; {self.name}'s student is its own")


OBJECTIVES: Registry = Registry("objective")  # what ``distill_loss`` and ``training/distill.py`` accept by name
register_objective = OBJECTIVES.register
unregister_objective = OBJECTIVES.unregister
get_objective = OBJECTIVES.named


def _di4c_student(model, latent_dim: int):
    return model if model.latent_dim else mixture_student(model, latent_dim)  # a resumed student has its latent


for _objective in (Objective("joint", joint_objective), Objective("marginal", marginal_objective),
                   # Di4C: its teacher also gives its marginals at x_t; its student runs DI4C_LATENTS components
                   # at x_t (with gradient) and at the teacher's x_s
                   Objective("di4c", di4c_objective, states=("data",), grows=False, student=_di4c_student,
                             teacher_passes=1, student_passes=2 * DI4C_LATENTS)):
    register_objective(_objective)


def distill_loss(student, teacher, x0: torch.Tensor, *, steps: int, k: int, objective: str,
                 teacher_config: SamplerConfig, generator: torch.Generator, seed: int, states: str = "student") -> dict:
    """One batch: states at the student's step boundaries, the teacher's k-step completions from them
    (``teacher_completion``), the objective on what the teacher committed. ``states`` (``STATE_SOURCES``):
    ``student`` (on-policy: where the student's own first j steps lead, ``rollout_states``: the teacher shows how
    to go on from the student's own mistakes), ``teacher`` (where the teacher's first k j steps lead) or ``data``
    (the data masked at the boundary, ``student_states``: close to the MLE the student was trained with). -> the
    objective's dict plus ``committed`` (tokens the teacher committed, the batch's)."""
    draw, sees_x0 = STATE_SOURCES[states]
    x_t, j = draw(student, teacher, x0, steps, k, teacher_config, generator, seed)
    done = teacher_completion(teacher, x_t, j, steps, k, teacher_config, seed)
    chosen = (x_t == student.cfg.dit.mask_id) & (done != student.cfg.dit.mask_id)
    completion = Completion(x_t, done, chosen, x0 if sees_x0 else None, teacher, generator)
    out = get_objective(objective).loss(student, completion)
    out["committed"] = chosen.sum()
    return out
