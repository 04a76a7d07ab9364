"""lltm.overrides: the measurement overrides of the CUDA library's choices,
parsed in Python (the C core reads no environment). Their effect on the
kernels is tested on a GPU (tests/test_cuda_sequence.py, test_cuda_cell.py)."""
import pytest

import lltm
from lltm import overrides
from lltm.overrides import SequencePlan


def test_environment_parsed_once_into_constraints():
    policy, plan = overrides._from_environment({
        "LLTM_CUDA_MATMUL": "cublas", "LLTM_CUDA_SEQUENCE": "grid",
        "LLTM_CUDA_CLUSTER_BLOCKS": "16", "LLTM_CUDA_CLUSTER_CHUNK": "16",
        "LLTM_CUDA_GRID_SHAPE": "16x32", "LLTM_CUDA_GRID_GROUPS": "3",
        "LLTM_CUDA_GRID_CHUNK": "4"})
    assert policy == "cublas"
    assert plan == SequencePlan("grid", 16, 16, "16x32", 3, 4)
    _, plan = overrides._from_environment({"LLTM_CUDA_SEQUENCE": "block",
                                           "LLTM_CUDA_BLOCK_CHUNK": "1"})
    assert plan == SequencePlan("block", block_chunk=1)
    assert overrides._from_environment({}) == ("auto", SequencePlan())
    assert SequencePlan().packed() == 0  # no constraint: the chooser decides


@pytest.mark.parametrize("name,value,match", [
    ("LLTM_CUDA_SEQUENCE", "fast", "family must be one of"),
    ("LLTM_CUDA_CLUSTER_BLOCKS", "12", "cluster_blocks must be one of"),
    ("LLTM_CUDA_CLUSTER_BLOCKS", "8", r"cluster_blocks must be one of \[16\]"),
    ("LLTM_CUDA_CLUSTER_CHUNK", "four", "must be an integer"),
    ("LLTM_CUDA_GRID_SHAPE", "8x8", "grid_shape must be one of"),
    ("LLTM_CUDA_GRID_SHAPE", "32x8", "grid_shape must be one of"),
    ("LLTM_CUDA_GRID_GROUPS", "0", "grid_groups must be an int >= 1"),
    ("LLTM_CUDA_GRID_CHUNK", "8", "grid_chunk must be one of"),
    ("LLTM_CUDA_BLOCK_CHUNK", "2", "block_chunk must be one of"),
    ("LLTM_CUDA_MATMUL", "tensor-cores", "LLTM_CUDA_MATMUL must be one of"),
])
def test_bad_environment_values_are_clear_errors(name, value, match):
    with pytest.raises(ValueError, match=match):
        overrides._from_environment({name: value})


def test_context_managers_set_and_restore():
    assert overrides._plan == SequencePlan()
    with lltm.overrides.sequence_plan(family="grid", grid_groups=2) as plan:
        assert plan == SequencePlan(family="grid", grid_groups=2)
        with lltm.overrides.sequence_plan(grid_shape="16x8"):
            assert overrides._plan == SequencePlan("grid", None, None, "16x8", 2)
        assert overrides._plan == plan
    assert overrides._plan == SequencePlan()
    with lltm.overrides.matmul("fused"):
        assert overrides._matmul == "fused"
    assert overrides._matmul == "auto"


def test_bad_constraints_are_refused_and_change_nothing():
    with pytest.raises(TypeError, match="unknown sequence plan constraints"):
        with lltm.overrides.sequence_plan(blocks=8):
            pass
    with pytest.raises(ValueError, match="cluster_chunk"):
        with lltm.overrides.sequence_plan(cluster_chunk=5):
            pass
    # the clusters come in one size, 16 blocks (csrc/core/lltm.h)
    with pytest.raises(ValueError, match=r"cluster_blocks must be one of \[16\] or None, got 8"):
        with lltm.overrides.sequence_plan(family="cluster", cluster_blocks=8):
            pass
    assert SequencePlan(cluster_blocks=16).packed() == 5 << 32  # log2(16) + 1 in field 8
    # a cluster a batch chunk: no cap on the clusters' batch groups
    with pytest.raises(ValueError, match="family 'cluster' takes no grid_groups"):
        with lltm.overrides.sequence_plan(family="cluster", grid_groups=1):
            pass
    with pytest.raises(ValueError, match="takes no grid_groups"):
        overrides._from_environment({"LLTM_CUDA_SEQUENCE": "cluster",
                                     "LLTM_CUDA_GRID_GROUPS": "1"})
    with pytest.raises(ValueError, match="matmul policy"):
        lltm.overrides.set_matmul("tf32")
    assert overrides._plan == SequencePlan()
    assert overrides._matmul == "auto"


def test_what_runs_is_reported_and_matches_the_c_structs():
    """sequence_plan_in_force / cell_route_in_force: the plan and route the
    CUDA operators would run (None without the CUDA library); their ctypes
    structs have the layout of lltm.h's (tests/sequence_emu.py
    declares the same from the header)."""
    import ctypes
    if overrides._cuda_library() is None:
        assert overrides.sequence_plan_in_force("float32", 10, 4, 3, 8) is None
        assert overrides.cell_route_in_force("float32", 4, 3, 8) is None
    with pytest.raises(ValueError, match="dtype must be one of"):
        overrides._dtype_code("int8")
    assert overrides._dtype_code("torch.bfloat16") == 3
    from sequence_emu import Launch, Plan  # checked against the C in the emulator tests

    def layout(struct):
        return [(name, ctypes.sizeof(t), getattr(struct, name).offset)
                for name, t in struct._fields_]
    assert layout(overrides._Launch) == layout(Launch)
    assert layout(overrides._Plan) == layout(Plan)
    assert ctypes.sizeof(overrides._Plan) == ctypes.sizeof(Plan)


@pytest.mark.parametrize("environ, chunks, stacked, match", [
    ({"LLTM_WAVEFRONT_CHUNKS": "3", "LLTM_STACKED_LAYERS": "off"}, 3, "off", None),
    ({"LLTM_WAVEFRONT_CHUNKS": "auto"}, None, "auto", None),
    ({"LLTM_WAVEFRONT_CHUNKS": "0"}, None, None, "LLTM_WAVEFRONT_CHUNKS must be an int >= 1"),
    ({"LLTM_WAVEFRONT_CHUNKS": "two"}, None, None, "LLTM_WAVEFRONT_CHUNKS must be an int >= 1"),
    ({"LLTM_STACKED_LAYERS": "yes"}, None, None, "LLTM_STACKED_LAYERS must be one of"),
])
def test_lltm_module_overrides_from_the_environment(environ, chunks, stacked, match):
    try:
        if match is not None:
            with pytest.raises(ValueError, match="override in the environment is invalid: "
                               + match):
                overrides.apply_environment(environ)
        else:
            overrides.apply_environment(environ)
            assert overrides.current_wavefront_chunks() == chunks
            assert overrides.current_stacked_layers() == stacked
    finally:
        overrides.apply_environment()
