"""FSDP2 (torch.distributed.fsdp.fully_shard) of a model containing lltm.LLTM
and lltm.LLTMCell, 2 processes, gloo on CPU (127.0.0.1 only): full gradients
and parameters after each of 2 steps equal a single process over the union
batch, in float32 and with MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32). The checks are scripts/multi_gpu.py's, which runs them
over NCCL on two GPUs."""
import sys
from pathlib import Path

import pytest
import torch

fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard") or not torch.distributed.is_available():
    pytest.skip("this torch has no FSDP2 (fully_shard)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import multi_gpu  # noqa: E402

TIMEOUT_S = 240


def test_fully_shard_equals_single_process():
    """fully_shard on the LLTM and on the whole model; parameters are DTensor
    shards (checked); SGD with momentum, 2 steps."""
    multi_gpu.spawn(["fsdp"], timeout_s=TIMEOUT_S)


def test_fully_shard_bfloat16_mixed_precision():
    """bfloat16 parameters in forward and backward (the LLTM's CPU kernels in
    bfloat16), gradients reduced in float32: equal to the float32 mean of each
    process's bfloat16 gradients, near the float32 gradients; the float32
    sharded parameters step with them."""
    multi_gpu.spawn(["fsdp_bf16"], timeout_s=TIMEOUT_S)
