"""Serving precision: explicit choices pass through; auto follows the hardware's bf16 support."""

from pathlib import Path

import pydantic
import pytest
import torch

from service.deployment import AppArgs
from ttcore.models import resolve_precision


def test_explicit_precision_is_kept_and_auto_follows_the_cpu_flags():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    want = "bf16" if flags & {"avx512_bf16", "amx_bf16"} else "fp32"
    assert resolve_precision("auto", cpu) == want


def test_serve_config_precision_is_validated():
    assert AppArgs(precision="auto").precision == "auto"
    with pytest.raises(pydantic.ValidationError, match="precision"):
        AppArgs(precision="fp16")
