"""Layers with explicit forward and backward passes, on NHWC arrays, writing into given buffers; each file
beside its kernel source (kernels/<name>.cu).

Layers hold no activations of their own: each backward takes, as arguments, exactly the forward values it
reads (its input x), except batch norm's, which owns the unit's store and reads it back (bn.py). So what is
kept is visible in one place: the unit's BatchNormReLU, which keeps a k-bit (or exact) store per unit and
nothing else of size.

    conv.py        Conv2D: any kernel size and stride, padding "same" or "valid", through the path object it
                   holds: GemmPath (im2col + GEMM) here, DirectPath (the CPU's float32 kernels) in
                   conv_direct.py, CudnnPath in conv_cudnn.py; a net's ConvPath chooses one per conv
    bn.py          BatchNormReLU: batch-statistics BN, gamma/beta and ReLU of a unit, fused with its store
    pool.py        MaxPool, AvgPool, GlobalAvgPool and the reference's ParameterFreeShortcut
    loss.py        softmax_cross_entropy: mean over a pass's images; loss, accuracy and dlogits
    launch.py      the launch shapes of the row kernels (bn.cu, pool.cu), and a conv's or pool's output size

The *_ref functions are plain NumPy statements of what each kernel computes (for readers and tests).
"""
from .bn import (GAMMA_MIN, ROWS_PER_CHUNK, STATS_CHUNK, STATS_ROWS, BatchNormReLU, add_and_keep_grad, add_and_save,
                 batchnorm_finish,
                 batchnorm_finish_ref, batchnorm_relu_backward, batchnorm_relu_backward_ref, batchnorm_relu_forward,
                 batchnorm_relu_forward_ref, batchnorm_relu_restore, batchnorm_statistics, batchnorm_statistics_ref,
                 code_windows, reduction_chunks, rounding_keys, update_running)
from .conv import COL_ELEMENTS, CONV_PATHS, Conv2D, ConvPath, GemmPath, col2im_ref, im2col_ref
from .launch import CPU_BLOCKS, GPU_BLOCK, GPU_MAX_BLOCKS, finish_launch, launch, output_size
from .loss import (softmax_cross_entropy, softmax_cross_entropy_backward, softmax_cross_entropy_backward_ref,
                   softmax_cross_entropy_ref)
from .pool import AvgPool, GlobalAvgPool, MaxPool, ParameterFreeShortcut, maxpool_backward_ref, pool_ref
