"""minibp: memory-efficient backprop with approximate activations (Chakrabarti & Moseley, NeurIPS 2019).

Read in this order: backend (NumPy or CuPy) -> kernels (one loader for CUDA sources on both devices) ->
arena (every buffer planned, one allocation) -> quant (the k-bit store) -> layers -> net (units,
residuals, the approximate-activation schedule) -> optim -> models -> data, checkpoint, train.
"""
__version__ = "0.1.0"
