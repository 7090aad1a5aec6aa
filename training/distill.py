"""Distil a teacher's sampler into a student that takes fewer steps (``ttcore.distill``): one student step learns
k teacher steps, by its exact joint likelihood of the teacher's k-step completions (``--objective joint``: a CP /
TT student), a per-position fit to them (``marginal``: SDTT's kind of target, the rank-1 baseline) or Di4C's
mixture student and loss (``di4c``: from a rank-1 checkpoint, on data states, ``--latent-dim``).

    python training/distill.py --config qm9_distill --teacher checkpoints/qm9-tt-r16 --steps 4 --k 4 \
        --objective joint --out runs/qm9-tt-r16-d4 --max-steps 1000 --resume
    python training/distill.py --config qm9_distill --teacher checkpoints/qm9-tt-r16 --steps 4 --rounds 2 \
        --objective joint --out runs/qm9-tt-r16-p4 --max-steps 500 --resume   # progressive: 16 -> 8 -> 4 steps

The student starts from the teacher's weights (``--student DIR``: from another checkpoint of the same family);
``--student-rank R`` grows a CP / TT start to rank R first (the same joint, then trained: more capacity in one
student step than its teacher's head has).
``--rounds R`` distils progressively as SDTT does: round i's student takes half the steps of its teacher (k = 2) and
teaches round i + 1; the first teacher runs ``steps * 2^R`` steps, the last student ``steps``; the last student is
written to OUT, the others beside it (``OUT-round-i``); ``--max-steps`` is each round's budget. The teacher
samples with ``--teacher-ordering`` (random by default, the student's order). Teacher samples are drawn on the
fly, each batch from streams keyed by (seed, step), so a resumed run is exact. The card and ``config.json``
record the teacher, objective and step count (``model.extra.distilled``; the service's ``GET /models`` shows it);
the final line states the budget in teacher and student forward passes and wall time.
"""

import time
from pathlib import Path

import torch
from _common import config_from_args, dataset, parser, tensors
from _loop import fit

from ttcore.distill import OBJECTIVES, STATES, distill_loss, get_objective
from ttcore.models import load_checkpoint, load_for_inference, load_train_state
from ttcore.parallel import is_main_process
from ttcore.sampling import SamplerConfig

SEED_STRIDE = 1_000_003  # a batch's teacher streams: seed * stride + step (distinct across steps and seeds)


def main():
    ap = parser(__doc__)
    ap.add_argument("--teacher", required=True, help="the teacher checkpoint (rank 1, CP or TT)")
    ap.add_argument("--student", help="the student's starting checkpoint (default: the teacher's weights)")
    ap.add_argument("--steps", type=int, required=True, help="the student's steps (the last round's)")
    ap.add_argument("--k", type=int, default=2, help="teacher steps per student step (one round)")
    ap.add_argument("--rounds", type=int, default=1, help="progressive rounds (k = 2 each when > 1)")
    ap.add_argument("--objective", choices=list(OBJECTIVES), default="joint")
    ap.add_argument("--teacher-ordering", default="random", help="the teacher's sampler ordering")
    ap.add_argument("--student-rank", type=int,
                    help="grow the CP / TT student to this rank (a multiple of its start's): the same joint at the "
                         "start (``JointModel.with_rank``), the model's head_noise breaking the copies' symmetry")
    ap.add_argument("--latent-dim", type=int, default=8, help="di4c: the mixture student's latent z (dimensions)")
    ap.add_argument("--states", choices=list(STATES), default="student",
                    help="where the states x_t come from: the student's own first steps (on-policy), the "
                         "teacher's, or the data masked at a step boundary")
    args = ap.parse_args()
    if args.rounds > 1 and args.k != 2:
        raise SystemExit("--rounds > 1 halves the steps each round: leave --k at 2")
    try:
        get_objective(args.objective).check(args.states, grown=bool(args.student_rank))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    cfg = config_from_args(args)
    teacher_dir, out = Path(args.teacher), Path(args.out)
    started, passes = time.time(), {"teacher": 0, "student": 0}
    for i in range(args.rounds):
        steps = args.steps * 2 ** (args.rounds - 1 - i)  # this round's student
        # the last student is OUT itself; the earlier ones its siblings (a checkpoint is written as a whole directory)
        target = out if i == args.rounds - 1 else out.with_name(f"{out.name}-round-{i + 1}")
        start = args.student if (i == 0 and args.student) else teacher_dir
        meta = distil_round(args, cfg, teacher_dir, Path(start), target, steps, args.k)
        passes["teacher"] += meta["distill"]["teacher_forward_passes"]
        passes["student"] += meta["distill"]["student_forward_passes"]
        teacher_dir = target
    if is_main_process():
        print(f"distilled {args.teacher} into {out}: {args.steps} steps ({args.objective}, {args.rounds} round(s)); "
              f"budget {passes['teacher']} teacher and {passes['student']} student forward passes of "
              f"{cfg.batch_size} sequences, {time.time() - started:.0f} s")


def distil_round(args, cfg, teacher_dir: Path, start: Path, out: Path, steps: int, k: int) -> dict:
    """One round: a student of ``steps`` steps fitted to ``teacher_dir`` at ``k * steps`` steps. -> its meta."""
    resuming = args.resume and out.exists() and load_train_state(out) is not None
    model, tokenizer, _ = load_checkpoint(out if resuming else start)
    objective = get_objective(args.objective)
    if objective.student is not None:  # e.g. di4c: the rank-1 start plus a latent (a new round's student)
        model = objective.student(model, args.latent_dim)
    if not resuming and args.student_rank and args.student_rank != model.cfg.rank:  # a later round's start is grown
        model = model.with_rank(args.student_rank, cfg.model.head_noise, torch.Generator().manual_seed(cfg.seed))
    teacher, _, _ = load_for_inference(teacher_dir, cfg.device if cfg.device != "auto" else "cpu", cfg.precision)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher_config = SamplerConfig(ordering=args.teacher_ordering)
    # the family stays the starting checkpoint's: a student serves the family its teacher serves
    record = {"teacher": teacher_dir.name, "objective": args.objective, "steps": steps, "teacher_steps": k * steps,
              "teacher_ordering": args.teacher_ordering, "states": args.states}
    if args.rounds > 1:  # a progressive run: where its chain of teachers started
        record.update(rounds=args.rounds, first_teacher=Path(args.teacher).name)
    model.cfg.extra["distilled"] = record
    train, val = tensors(dataset(cfg, tokenizer))

    def loss(student, x0, generator, step):
        teacher.to(x0.device)
        return distill_loss(student, teacher, x0, steps=steps, k=k, objective=args.objective,
                            teacher_config=teacher_config, generator=generator,
                            seed=(cfg.seed * SEED_STRIDE + step) % 2**62, states=args.states)

    title = f"{model.cfg.extra.get('family', 'model')} {model.cfg.decomposition} r={model.cfg.rank} distilled " \
            f"to {steps} steps from {teacher_dir.name} at {k * steps} ({args.objective})"
    meta = fit(model, tokenizer, train, val, cfg, out, resume=resuming, max_steps=args.max_steps,
               max_minutes=args.max_minutes, title=title, quiet=args.quiet, fit_minutes=args.fit_minutes,
               objective=loss)
    meta["distill"] = {"teacher_forward_passes": (k + objective.teacher_passes) * meta["step"],  # a batch's
                       "student_forward_passes": objective.student_passes * meta["step"]}
    if is_main_process():
        print(f"wrote {out}: step {meta['step']}, val {meta['val']}, {meta['seconds_per_step']:.3f} s/step")
    return meta


if __name__ == "__main__":
    main()
