"""minibp/constants.py: the numbers Python and the kernels share reach every build exactly."""
import numpy as np

from minibp import build, constants, kernels


def test_each_literal_is_the_value_itself():
    for name, value in constants.SHARED.items():
        text = constants.literal(value)
        assert text.endswith("f") == isinstance(value, np.float32), name
        parsed = float.fromhex(text.rstrip("f"))
        assert parsed == float(value), name
        if isinstance(value, np.float32):
            assert np.float32(parsed) == value


def test_every_build_defines_every_shared_constant():
    cpu, gpu = build.cpu_compile_command("float"), kernels.gpu_compile_options("float")
    for name in constants.SHARED:
        assert sum(option.startswith(f"-D{name}=") for option in cpu) == 1, name
        assert sum(option.startswith(f"-D{name}=") for option in gpu) == 1, name


def test_the_references_read_the_same_values():
    from minibp import quant
    from minibp.layers import bn
    assert quant.MASK_THRESHOLD is constants.MASK_THRESHOLD and bn.GAMMA_MIN is constants.GAMMA_MIN
