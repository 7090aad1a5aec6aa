"""Few-step generation: orderings, step schedules, EB-Sampler and joint steps in one loop."""

from .eb import PROXIES, eb_accepts
from .generate import GenerationRun, StepState, generate, step_together
from .joint_step import chain_rule_step, joint_distribution, predetermined_step
from .orderings import ADAPTIVE, ORDERINGS, PREDETERMINED, top_k_mask
from .schedules import SCHEDULES, unmask_counts

__all__ = ["ADAPTIVE", "ORDERINGS", "PREDETERMINED", "PROXIES", "SCHEDULES", "GenerationRun", "StepState",
           "chain_rule_step", "eb_accepts", "generate", "joint_distribution", "predetermined_step",
           "step_together", "top_k_mask", "unmask_counts"]
