"""What TF32's rounding in the convolutions does to a step's loss and gradients, emulated on the CPU: the test that
compares cuDNN's gradients with the GEMM path's (tests/test_gpu.py) runs here with every GEMM of the GEMM path taking
its operands rounded to TF32 (10 bits of mantissa, as a tensor core reads float32), and, for scale, with the
products summed in float64 and rounded once (float32 in another order of additions, as another library's float32
sums are).

    python3 bench/tf32.py                  # ResNet-20 on 16x16 images, batch 16, exact and 4 bits

On an H200, cuDNN's 4-bit gradients differed from the GEMM path's by 12.5% (relative L2 norm; docs/gpu.md), where
the test allows 0.1%. If TF32 is why, rounding the operands to TF32 here gives a gap of that size, and another
float32 order of additions one far under the test's 0.1%.
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nets import resnet20_16x16  # noqa: E402  (the test's own net)
from minibp import backend, blas, program  # noqa: E402
from minibp.layers import conv  # noqa: E402


def tf32(a):
    """a (float32) rounded to TF32's 10-bit mantissa, to nearest even, kept as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    odd = (bits >> np.uint32(13)) & np.uint32(1)  # ties go to the even neighbour
    return ((bits + np.uint32(0x0FFF) + odd) & np.uint32(0xFFFFE000)).view(np.float32)


ROUNDINGS = {  # how an emulated GEMM forms op(a) @ op(b) in float32
    "TF32 operands": lambda a, b: tf32(a) @ tf32(b),
    "float32, summed in float64": lambda a, b: (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32),
}


def emulated(product):
    """A blas.gemm whose product is `product` (the NumPy path: CPU)."""
    def gemm(a, b, c, *, trans_a=False, trans_b=False, accumulate=False, cublas=None):
        def run(op_a, op_b, c):
            if accumulate:
                c += product(op_a, op_b)
            else:
                c[...] = product(op_a, op_b)
        program.issue("gemm", run, a.T if trans_a else a, b.T if trans_b else b, c)
    return gemm


def step(bits, x, y):
    """(loss, flat gradient in float64) of one step of the test's net through the GEMM path."""
    net = resnet20_16x16().compile(pass_images=16, bits=bits, seed=0, conv="gemm")
    loss = net.forward(x, y)[0]
    net.backward()
    return loss, backend.to_host(net.grads).astype(np.float64)


def main():
    if backend.device != "cpu":
        print("bench/tf32.py emulates on the CPU (MINIBP_DEVICE=cpu)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 16, 16, 3)).astype(np.float32), rng.integers(0, 10, 16)
    print(f"bench/tf32.py, {time.strftime('%Y-%m-%d')}: ResNet-20, 16x16, batch 16, one step through the GEMM path; "
          "each rounding against NumPy's float32 GEMM")
    print(f"{'bits':>5} {'rounding':>28} {'loss difference':>15} {'gradient relative error':>23}")
    real = blas.gemm
    for bits in ("exact", "4"):
        loss, grads = step(bits, x, y)
        for name, product in ROUNDINGS.items():
            conv.blas.gemm = emulated(product)
            try:
                other_loss, other = step(bits, x, y)
            finally:
                conv.blas.gemm = real
            error = np.linalg.norm(other - grads) / np.linalg.norm(grads)
            print(f"{bits:>5} {name:>28} {abs(other_loss - loss):15.2e} {error:23.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
