"""Few-step generation: orderings, step schedules, EB-Sampler and joint steps in one loop."""

from .config import InvalidSampler, SamplerConfig
from .eb import EB_PROXIES, eb_accepts, eb_score
from .generate import BatchStep, GenerationRun, StepState, batch_step, generate, make_run
from .joint_step import joint_distribution, predetermined_step
from .orderings import ADAPTIVE, PREDETERMINED, top_k_mask
from .schedules import SCHEDULES, unmask_counts
from .steps.chain_rule import chain_rule_step

__all__ = ["ADAPTIVE", "EB_PROXIES", "PREDETERMINED", "SCHEDULES", "BatchStep", "GenerationRun", "InvalidSampler",
           "SamplerConfig", "StepState", "batch_step", "chain_rule_step", "eb_accepts", "eb_score", "generate",
           "joint_distribution", "make_run", "predetermined_step", "top_k_mask", "unmask_counts"]
