"""The CUDA sequence kernels (csrc/core/lltm_cuda_seq*.cu) compiled by g++
against the fiber emulator of tests/cuda_emu, and the ctypes view of their C
API (lltm.h): the device and plan structs, the chooser, the launchers. Used
through the fixture ``emu`` (conftest.py, built once per test run) by
tests/test_cuda_sequence_emulated.py (the kernels against the reference) and
tests/test_cuda_layer_emulated.py (the layer's entry points), with the
inputs, float64 reference and checks they share. The emulator plays an H100 unless
told otherwise: DEVICE_SETS and device_set describe the other devices it can
play (tests/test_schedule_validity.py)."""
import contextlib
import ctypes
import hashlib
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch

from lltm import reference


ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "csrc" / "core"
# every translation unit of the sequence code (lltm_cuda_sequence.cuh lists the parts)
CU_SOURCES = sorted(CORE.glob("lltm_cuda_seq*.cu")) + [CORE / "lltm_cuda_util.cu",
                                                        CORE / "lltm_cuda_rules.c"]
EMU_INCLUDE = Path(__file__).resolve().parent / "cuda_emu"

DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2,
              torch.bfloat16: 4e-2}
ANY, STEPS, GRID, CLUSTER, BLOCK = 0, 1, 2, 3, 4  # lltm_sequence_plan.family
EXCHANGE_GLOBAL, EXCHANGE_BROADCAST, EXCHANGE_REDUCE_SCATTER, EXCHANGE_LOCAL = 1, 2, 3, 4


class Device(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("device", "major", "minor", "sm_count", "smem_optin", "cooperative_launch",
                 "cluster_launch", "code_arch", "tf32")]


class Launch(ctypes.Structure):
    _fields_ = [("lanes", ctypes.c_int), ("values", ctypes.c_int), ("rows", ctypes.c_int),
                ("chunk", ctypes.c_int), ("exchange", ctypes.c_int), ("tf32", ctypes.c_int),
                ("blocks", ctypes.c_int64), ("groups", ctypes.c_int64), ("smem", ctypes.c_size_t)]


class Plan(ctypes.Structure):
    _fields_ = [("family", ctypes.c_int), ("dtype", ctypes.c_int), ("B", ctypes.c_int64),
                ("H", ctypes.c_int64), ("forward", Launch), ("backward", Launch),
                ("workspace_bytes", ctypes.c_size_t)]


class StackPlan(ctypes.Structure):
    """lltm_stack_plan of csrc/core/lltm_stack.h"""
    _fields_ = [("dtype", ctypes.c_int), ("layers", ctypes.c_int), ("B", ctypes.c_int64),
                ("H", ctypes.c_int64), ("forward", Launch), ("backward", Launch),
                ("workspace_bytes", ctypes.c_size_t)]


class StackForwardLayer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("weights", "bias", "h0", "c0", "gates", "output", "cells", "h_n", "c_n")]


class StackBackwardLayer(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in
                ("weights", "cells", "gates", "grad_h_n", "grad_c_n", "grad_gates", "grad_bias",
                 "grad_h0", "grad_c0", "h0", "output", "grad_weights")]


class Options(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in
                ("family", "grid_lanes", "grid_values", "grid_groups_max", "cluster_blocks",
                 "cluster_chunk", "concurrent", "grid_chunk", "block_chunk", "eager",
                 "grid_tf32")]


# the plans the tests ask the chooser for (lltm_sequence_plan_options):
# the cluster family (16 blocks of 8 units at H <= 128), also without its
# batch split (chunk 16: the layout of B > 16) and with chunks of 8 rows
# (where 4-row clusters do not fit), every grid layout, and the block family
# in both of its chunks
PLANS = {"cluster_32_4": dict(family=CLUSTER, cluster_blocks=16),
         "cluster_32_4_nosplit": dict(family=CLUSTER, cluster_blocks=16, cluster_chunk=16),
         "cluster_32_4_split8": dict(family=CLUSTER, cluster_blocks=16, cluster_chunk=8),
         "grid_16_8": dict(family=GRID, grid_lanes=16, grid_values=8),
         "grid_32_32": dict(family=GRID, grid_lanes=32, grid_values=32),
         "grid_16_32": dict(family=GRID, grid_lanes=16, grid_values=32),
         "grid_16_8_c4": dict(family=GRID, grid_lanes=16, grid_values=8, grid_chunk=4),
         "grid_32_32_c4": dict(family=GRID, grid_lanes=32, grid_values=32, grid_chunk=4),
         "grid_16_32_c4": dict(family=GRID, grid_lanes=16, grid_values=32, grid_chunk=4),
         # the half types' only (tensor cores; a lane takes several rows of a chunk)
         "grid_8_64": dict(family=GRID, grid_lanes=8, grid_values=64),
         "grid_16_64": dict(family=GRID, grid_lanes=16, grid_values=64),
         "grid_8_64_c4": dict(family=GRID, grid_lanes=8, grid_values=64, grid_chunk=4),
         "grid_16_64_c4": dict(family=GRID, grid_lanes=16, grid_values=64, grid_chunk=4),
         "block_c1": dict(family=BLOCK, block_chunk=1),
         "block_c4": dict(family=BLOCK, block_chunk=4)}


def build(tmp_path_factory):
    """The sequence's .cu files compiled as they are by g++ against the
    fiber emulator (one object a unit, two at a time), linked into one
    library."""
    headers = (sorted(CORE.glob("*.h")) + sorted(CORE.glob("*.cuh"))
               + sorted(EMU_INCLUDE.glob("*.h")))
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in CU_SOURCES + headers)).hexdigest()[:12]
    out = tmp_path_factory.mktemp("cuda_emu_sequence")
    flags = ["g++", "-std=c++17", "-O1", "-fPIC", "-Wall", "-Wextra", "-Wno-unknown-pragmas",
             "-Werror", "-x", "c++", "-I", str(EMU_INCLUDE),
             "-I", str(CORE)]

    def compile_one(src):
        obj = out / f"{src.stem}_{digest}.o"
        proc = subprocess.run(flags + ["-c", str(src), "-o", str(obj)], capture_output=True,
                              text=True)
        return obj, proc

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, CU_SOURCES))
    for obj, proc in results:
        assert proc.returncode == 0, proc.stderr
    lib = out / "libsequence_emu.so"
    proc = subprocess.run(["g++", "-shared", "-o", str(lib)] + [str(o) for o, _ in results],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return _declare(ctypes.CDLL(str(lib)))


def device(lib, ordinal=0, **changes):
    """The emulated device (device 0: an H100's properties), as
    lltm_cuda_device_query reports it, with `changes`"""
    dev = Device()
    assert lib.lltm_cuda_device_query(ordinal, ctypes.byref(dev)) == 0
    for name, value in changes.items():
        setattr(dev, name, value)
    return dev


class DeviceSet(NamedTuple):
    """A device the emulator plays (tests/cuda_emu/emu_device.h): what its
    runtime reports and its occupancy answers follow from."""
    sm_count: int
    major: int
    minor: int
    smem_optin: int          # dynamic shared memory a block may opt in to, bytes
    smem_per_sm: int         # shared memory of an SM, bytes
    max_threads_per_sm: int
    regs_per_sm: int
    max_cluster: int         # blocks a cluster, non-portable sizes included (0: no clusters)
    max_clusters: int        # clusters resident at once (0: as many as the SMs hold)
    code_arch: int           # virtual architecture of the library's code that runs there


KB = 1024
# Per compute capability (threads, shared memory and registers of an SM, a
# block's opt-in shared memory): the CUDA C++ Programming Guide, "Compute
# Capabilities", its table of technical specifications per compute
# capability (docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/
# compute-capabilities.html), as the architectures' tuning guides restate
# them (docs.nvidia.com/cuda/{turing,ampere,ada,hopper,blackwell}-tuning-guide;
# e.g. compute capability 8.6: 100 KB of shared memory an SM, 99 KB a
# block, 1 KB of it kept by the system a block). Clusters: 8 blocks is the
# portable size; Hopper takes 16 with the non-portable opt-in (the guide's
# "Thread Block Clusters"). SM counts are a product's, named in each row.
# max_clusters: 7 is what an H100 SXM answers for clusters of 16 (the
# default device's); the others publish no such answer, so their SMs alone
# bound it.
DEVICE_SETS = {
    "sm_75": DeviceSet(40, 7, 5, 64 * KB, 64 * KB, 1024, 65536, 0, 0, 75),  # Tesla T4
    "sm_80": DeviceSet(108, 8, 0, 163 * KB, 164 * KB, 2048, 65536, 0, 0, 80),  # A100
    "sm_86": DeviceSet(84, 8, 6, 99 * KB, 100 * KB, 1536, 65536, 0, 0, 86),  # RTX A6000
    "sm_89": DeviceSet(58, 8, 9, 99 * KB, 100 * KB, 1536, 65536, 0, 0, 89),  # L4
    "sm_90": DeviceSet(132, 9, 0, 227 * KB, 228 * KB, 2048, 65536, 16, 7, 90),  # H100 SXM
    "sm_100": DeviceSet(148, 10, 0, 227 * KB, 228 * KB, 2048, 65536, 16, 0, 100),  # B200
    "sm_120": DeviceSet(170, 12, 0, 99 * KB, 100 * KB, 1536, 65536, 8, 0, 120),  # RTX 5090
    # an H100 running the library's compute_80 PTX (a build without sm_90
    # code): the device has clusters, the code none
    "sm_90_ptx80": DeviceSet(132, 9, 0, 227 * KB, 228 * KB, 2048, 65536, 16, 7, 80),
}


@contextlib.contextmanager
def device_set(lib, name):
    """The emulator playing DEVICE_SETS[name] as the current device, under
    an ordinal of its own (the chooser caches its answers per ordinal);
    yields that device as lltm_cuda_device_query reports it. Device 0 (the
    H100) is current again after."""
    ordinal = list(DEVICE_SETS).index(name) + 1
    assert lib.emu_set_device(ordinal, *DEVICE_SETS[name]) == 0
    assert lib.emu_use_device(ordinal) == 0
    try:
        yield device(lib, ordinal)
    finally:
        lib.emu_use_device(0)


def make_plan(lib, dtype, T, B, I, H, dev=None, **options):
    """(status, Plan) of the chooser for these sizes and options"""
    plan = Plan()
    status = lib.lltm_sequence_plan_cuda(ctypes.byref(dev or device(lib)), DTYPE_CODES[dtype],
                                         T, B, I, H, ctypes.byref(Options(**options)),
                                         ctypes.byref(plan))
    return status, plan


def _declare(lib):
    i64, p, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.lltm_cuda_device_query.argtypes = [i32, p]
    lib.lltm_sequence_plan_cuda.argtypes = [p, i32, i64, i64, i64, i64, p, p]
    lib.lltm_sequence_plan_residency_cuda.argtypes = [p, p, p, p]
    lib.lltm_sequence_forward_persistent_cuda.argtypes = [p, i64, i64, i64, i64] + [p] * 12
    lib.lltm_sequence_backward_persistent_cuda.argtypes = [p, i64, i64, i64, i64] + [p] * 13
    lib.lltm_sequence_forward_step_cuda.argtypes = [i32, i64, i64, i64] + [p] * 8
    lib.lltm_sequence_backward_step_cuda.argtypes = [i32, i64, i64, i64, i64] + [p] * 11
    lib.lltm_sequence_step_bias_parts.argtypes = [i64, i64]
    lib.lltm_sequence_step_bias_parts.restype = i64
    lib.lltm_sequence_last_state_cuda.argtypes = [i32, i64, i64, i64, p, p, p, p]
    lib.lltm_sequence_bias_sum_cuda.argtypes = [i32, i64, i64, p, p, p]
    lib.lltm_stack_plan_cuda.argtypes = [p, i32, i32, i64, i64, i64, i64, p]
    lib.lltm_stack_forward_persistent_cuda.argtypes = [p, i64, i64, i64, i64, p, p, p, p]
    lib.lltm_stack_backward_persistent_cuda.argtypes = [p, i64, i64, i64, i64, p, p, p, p, p]
    lib.emu_set_device.argtypes = [i32] * 11
    lib.emu_use_device.argtypes = [i32]
    lib.emu_blocks_per_sm.argtypes = [i32, ctypes.c_longlong]
    lib.emu_resident_clusters.argtypes = [i32, i32, ctypes.c_longlong]
    for fn in (lib.emu_set_device, lib.emu_use_device, lib.emu_blocks_per_sm,
               lib.emu_resident_clusters, lib.lltm_cuda_device_query, lib.lltm_sequence_plan_cuda,
               lib.lltm_sequence_plan_residency_cuda, lib.lltm_sequence_forward_persistent_cuda,
               lib.lltm_sequence_backward_persistent_cuda, lib.lltm_sequence_forward_step_cuda,
               lib.lltm_sequence_backward_step_cuda, lib.lltm_sequence_last_state_cuda,
               lib.lltm_sequence_bias_sum_cuda, lib.lltm_stack_plan_cuda,
               lib.lltm_stack_forward_persistent_cuda, lib.lltm_stack_backward_persistent_cuda):
        fn.restype = ctypes.c_int
    return lib


# --- inputs, the float64 reference and checks shared by the emulated tests --------

def layer_inputs(T, B, I, H, dtype):
    g = torch.Generator().manual_seed(torch.randint(2**31 - 1, ()).item())
    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    args64 = [rand(T, B, I), rand(3 * H, I + H, scale=2.0 / (I + H) ** 0.5), rand(3 * H),
              rand(B, H), rand(B, H)]
    args = [a.to(dtype) for a in args64]  # the reference sees the rounded inputs
    return args, [a.double() for a in args]


def reference_layer(x, W, b, h0, c0, lengths=None):
    """float64 outputs of the reference loop, its per-step activations, and a
    backward closure for (grad_output, grad_h_n, grad_c_n). lengths [B] or
    None: row b stops after lengths[b] steps (state kept, output and
    activations 0 beyond them)."""
    args = [t.clone().requires_grad_() for t in (x, W, b, h0, c0)]
    H = h0.shape[1]
    h, c, outs, cells, acts = args[3], args[4], [], [], []
    for t in range(x.shape[0]):
        g = torch.cat([h, args[0][t]], 1) @ args[1].t() + args[2]
        act = torch.cat([g[:, :H].sigmoid(), g[:, H:2 * H].sigmoid(),
                         torch.nn.functional.elu(g[:, 2 * H:])], 1)
        h_t, c_t = reference.lltm_cell(args[0][t], args[1], args[2], h, c)
        if lengths is None:
            h, c, out = h_t, c_t, h_t
        else:
            live = (lengths > t).unsqueeze(1)
            h, c = torch.where(live, h_t, h), torch.where(live, c_t, c)
            out, act = torch.where(live, h_t, 0), torch.where(live, act, 0)
        acts.append(act)
        outs.append(out)
        cells.append(c)
    output, cells_t, acts_t = torch.stack(outs), torch.stack(cells), torch.stack(acts)

    def backward(grad_output, grad_h_n, grad_c_n):
        grads = torch.autograd.grad((output, h, c), args, (grad_output, grad_h_n, grad_c_n),
                                    allow_unused=True)
        return [torch.zeros_like(a) if gr is None else gr for a, gr in zip(args, grads)]
    return output.detach(), h.detach(), c.detach(), cells_t.detach(), acts_t.detach(), backward


def assert_close_to(name, got, want, dtype):
    tol = TOLERANCES[dtype]
    got = got.double()
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale, msg=name)


def weight_grads(dG, x, W, h0, output, H):
    """What the binding does after the backward kernel (cuBLAS there)."""
    T, B, G = dG.shape
    dG2 = dG.double().reshape(T * B, G)
    h_prev = torch.cat([h0.double().unsqueeze(0), output.double()[:-1]], 0).reshape(T * B, H)
    dW = torch.cat([dG2.t() @ h_prev, dG2.t() @ x.double().reshape(T * B, -1)], 1)
    dx = (dG2 @ W.double()[:, H:]).reshape(T, B, -1)
    return dW, dx


def random_lengths(T, B):
    """B random lengths in [1, T], 1 and T among them (where B allows)."""
    lengths = torch.randint(1, T + 1, (B,), dtype=torch.int64)
    lengths[0] = T
    if B > 1:
        lengths[B // 2] = 1
    return lengths


# --- the core's matrix-product callback, in torch -------------------------------

GEMM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                        ctypes.c_void_p, ctypes.c_int64)
DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _strided(ptr, dtype, rows, cols, rs, cs):
    """A tensor over emulated device memory at ptr"""
    extent = (rows - 1) * rs + (cols - 1) * cs + 1
    size = torch.empty((), dtype=dtype).element_size()
    buffer = (ctypes.c_char * (extent * size)).from_address(ptr)
    return torch.frombuffer(buffer, dtype=dtype).as_strided((rows, cols), (rs, cs))


@GEMM
def torch_gemm(ctx, code, M, N, K, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc):
    """The core's matrix-product callback, as the binding's aten::mm"""
    dtype = DTYPES_BY_CODE[code]
    A, Bm = _strided(a, dtype, M, K, a_rs, a_cs), _strided(b, dtype, K, N, b_rs, b_cs)
    _strided(c, dtype, M, N, ldc, 1).copy_((A.double() @ Bm.double()).to(dtype))
    return 0
