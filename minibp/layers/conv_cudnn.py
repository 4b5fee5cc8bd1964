"""Convolutions through NVIDIA's cuDNN frontend (GPU only; CuPy 14 ships no cuDNN bindings).

For one Conv2D geometry and pass size, three graphs, built once and cached: fprop (y = conv(x, w)),
dgrad (dx from dy and w) and wgrad (dw from x and dy). All tensors are float32 and NHWC in memory,
described to cuDNN as NCHW dimensions with NHWC strides; weights are (Cout, kh, kw, Cin), cuDNN's
KRSC filter layout. Padding is TensorFlow's "same" (possibly one more row/column after than
before), given as pre/post padding. Workspace comes from the arena; the handle runs on CuPy's
current stream. The GEMM path (conv.GemmPath) stays the reference: the GPU tests compare the two.
A net's convs come here through conv.ConvPath (Net.compile(conv="cudnn")), which calls the functions at the
end of this file and gives each conv with graphs a CudnnPath.

Float32 as the GEMMs compute it: cuDNN runs float32 convolutions on TF32 tensor cores unless told not to, so
after the heuristics propose their plans, those whose numerical notes say TENSOR_CORE or DOWN_CONVERT_INPUTS
(TF32's 10-bit mantissa), or REDUCED_PRECISION_REDUCTION, are dropped; so are the NONDETERMINISTIC ones, so
that a replayed step equals an eager one. TF32 is a named opt-in, Net.compile(conv="cudnn-tf32"). (On an H200
the 4-bit gradients through cuDNN differed from the GEMM path's by 12.5%: TF32's rounding of the forward moves
some 4-bit codes across their bin edges, docs/gpu.md.)

An execute goes through program.issue, so a recorded pass holds it, with the tensors' addresses bound once;
the handle follows CuPy's current stream at each call, as minibp's cuBLAS binding does (blas.py), so a CUDA
graph captures it on the capturing stream.

Status: the graph descriptions and the plan filter are checked on the CPU in CI (tests/layers/test_conv_cudnn.py); the
float32-only plans have not run on a GPU yet (docs/gpu.md). GEMM stays the GPU's default until they have.

    graphs = ConvGraphs(conv, pass_images=128)   # descriptions only: no device needed
    graphs.build(handle)                         # on the GPU: plans, and graphs.workspace_bytes
    graphs.forward(x, w, y, workspace=ws)
"""
import numpy as np

from .. import backend, extras, program

# The numerical notes of the plans a float32 conv refuses (REFUSED_NOTES), and with conv="cudnn-tf32" (TF32_NOTES).
TF32_NOTES = ("REDUCED_PRECISION_REDUCTION", "NONDETERMINISTIC")
REFUSED_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS") + TF32_NOTES


def import_cudnn():
    """The cudnn frontend module, or an ImportError that says how to install it."""
    try:
        import cudnn
    except ImportError as e:
        raise ImportError(extras.missing("cudnn", f"cuDNN convolutions need NVIDIA's cuDNN frontend ({e})")) from None
    return cudnn


def nhwc(n, h, w, c):
    """(dims, strides) of an NHWC tensor in cuDNN's NCHW-ordered description."""
    return [n, c, h, w], [h * w * c, 1, w * c, c]


def krsc(k, r, s, c):
    """(dims, strides) of (Cout, kh, kw, Cin) weights in cuDNN's KCRS-ordered description."""
    return [k, c, r, s], [r * s * c, 1, s * c, c]


class ConvGraphs:
    """The fprop, dgrad and wgrad graphs of one convolution over a pass of pass_images images; tf32: allow TF32
    plans."""

    def __init__(self, conv, *, pass_images, tf32=False):
        cudnn = import_cudnn()
        self.conv, self.pass_images, self.tf32 = conv, int(pass_images), bool(tf32)
        f32 = cudnn.data_type.FLOAT
        c = conv
        x_dims = nhwc(self.pass_images, c.H, c.W, c.cin)
        y_dims = nhwc(self.pass_images, c.Ho, c.Wo, c.cout)
        w_dims = krsc(c.cout, c.kh, c.kw, c.cin)
        post = [(c.Ho - 1) * c.stride + c.kh - c.H - c.pad_top, (c.Wo - 1) * c.stride + c.kw - c.W - c.pad_left]
        geometry = dict(pre_padding=[c.pad_top, c.pad_left], post_padding=[max(p, 0) for p in post],
                        stride=[c.stride, c.stride], dilation=[1, 1], compute_data_type=f32)
        layouts = dict(x=x_dims, dx=x_dims, w=w_dims, dw=w_dims, y=y_dims, dy=y_dims)

        def make(op, inputs, output):
            """A graph of one conv node: inputs are (tensor name, the node's keyword) pairs."""
            g = cudnn.pygraph(io_data_type=f32, intermediate_data_type=f32, compute_data_type=f32)
            tensors = {name: g.tensor(name=name, dim=layouts[name][0], stride=layouts[name][1], data_type=f32)
                       for name, _ in inputs}
            out = getattr(g, op)(**{keyword: tensors[name] for name, keyword in inputs}, name=op, **geometry)
            out.set_output(True).set_dim(layouts[output][0]).set_stride(layouts[output][1]).set_data_type(f32)
            tensors[output] = out
            return g, tensors

        self.graphs = {
            "fprop": make("conv_fprop", [("x", "image"), ("w", "weight")], "y"),    # y = conv(x, w)
            "dgrad": make("conv_dgrad", [("dy", "loss"), ("w", "filter")], "dx"),   # dx from dy and w
            "wgrad": make("conv_wgrad", [("x", "image"), ("dy", "loss")], "dw"),    # dw from x and dy
        }
        self.handle = None
        self.workspace_bytes = 0

    def refused_notes(self):
        """The numerical notes (cudnn.numerical_note members) of the plans this conv drops."""
        cudnn = import_cudnn()
        return [getattr(cudnn.numerical_note, name) for name in (TF32_NOTES if self.tf32 else REFUSED_NOTES)]

    def build(self, handle):
        """Validate the graphs and build their execution plans (GPU), the refused ones dropped after the
        heuristics propose them; sets workspace_bytes."""
        cudnn = import_cudnn()
        for name, (g, _) in self.graphs.items():
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.deselect_numeric_notes(self.refused_notes())
            g.check_support()
            g.build_plans()
            self.workspace_bytes = max(self.workspace_bytes, int(g.get_workspace_size()))
        self.handle = handle

    def _run(self, name, buffers, workspace):
        g, tensors = self.graphs[name]
        pointers = {tensors[key]: array.data.ptr for key, array in buffers.items()}
        workspace = workspace.data.ptr if workspace is not None else None
        program.issue(f"cudnn {name}", self._execute, g, pointers, workspace, keep=tuple(buffers.values()))

    def _execute(self, g, pointers, workspace):
        self.handle.follow_stream()
        g.execute(pointers, workspace, handle=self.handle.handle)

    def forward(self, x, w, y, *, workspace):
        self._run("fprop", dict(x=x, w=w, y=y), workspace)

    def backward_data(self, dy, w, dx, *, workspace):
        self._run("dgrad", dict(dy=dy, w=w, dx=dx), workspace)

    def backward_weights(self, x, dy, dw, *, workspace):
        self._run("wgrad", dict(x=x, dy=dy, dw=dw), workspace)


class CudnnPath:
    """A Conv2D's path when its net compiled with conv="cudnn" (conv.py's protocol): the graphs at the
    compiled pass_images, the arena's workspace, and a weight-sized scratch (wgrad overwrites; minibp
    accumulates). A pass of another size, and a data gradient added into another (dgrad overwrites), take
    fallback, "auto"'s path."""

    def __init__(self, graphs, *, fallback, workspace, dw_scratch):
        self.graphs, self.fallback, self.workspace, self.dw_scratch = graphs, fallback, workspace, dw_scratch
        self.pass_images = graphs.pass_images

    def forward(self, x, w, y, *, col):
        if x.shape[0] != self.pass_images:
            self.fallback.forward(x, w, y, col=col)
            return
        self.graphs.forward(x, w, y, workspace=self.workspace)

    def backward_data(self, w, dy, dx, *, accumulate, col):
        if dy.shape[0] != self.pass_images or accumulate:
            self.fallback.backward_data(w, dy, dx, accumulate=accumulate, col=col)
            return
        self.graphs.backward_data(dy, w, dx, workspace=self.workspace)

    def backward_weights(self, x, dy, dw, *, accumulate, col):
        """wgrad writes dw itself (a step's first sub-batch), or (accumulate) its scratch, then added in."""
        if x.shape[0] != self.pass_images:
            self.fallback.backward_weights(x, dy, dw, accumulate=accumulate, col=col)
            return
        if not accumulate:
            self.graphs.backward_weights(x, dy, dw, workspace=self.workspace)
            return
        scratch = self.dw_scratch[: dw.size].reshape(dw.shape)
        self.graphs.backward_weights(x, dy, scratch, workspace=self.workspace)
        program.add(dw, scratch)


class Handle:
    """A cuDNN handle that runs on CuPy's current stream: follow_stream() binds it to the stream of the call."""

    def __init__(self):
        cudnn = import_cudnn()
        if backend.device != "gpu":
            raise RuntimeError("cuDNN convolutions run on the GPU only (MINIBP_DEVICE=gpu)")
        self.handle, self.stream = cudnn.create_handle(), None
        self.follow_stream()

    def follow_stream(self):
        stream = backend.xp.cuda.get_current_stream().ptr
        if stream != self.stream:
            import_cudnn().set_stream(handle=self.handle, stream=stream)
            self.stream = stream


def build_graphs(convs, *, pass_images, tf32=False):
    """{conv layer: its ConvGraphs, built} for these convs over passes of pass_images images (GPU only)."""
    handle = Handle()
    graphs = {conv: ConvGraphs(conv, pass_images=pass_images, tf32=tf32) for conv in convs}
    for g in graphs.values():
        g.build(handle)
    return graphs


# ----------------------------------------------------------------------------- a net's convs (Net.compile)

def net_graphs(units, *, pass_images, dtype, tf32=False):
    """{conv layer: its ConvGraphs, built} for every conv of these units but the classifier's, and their
    projections, over passes of the compiled pass_images (GPU, float32; tf32: TF32 plans allowed)."""
    if dtype != np.float32:
        raise ValueError("the cuDNN path is float32 only")
    convs = [c for u in units if not u.is_classifier for c in u.convs()]
    return build_graphs(convs, pass_images=pass_images, tf32=tf32)


def plan_buffers(plan, graphs, *, dtype):
    """Add the cuDNN path's buffers to a step's plan (conv.ConvPath), for graphs {conv: ConvGraphs}: their
    workspace, and the largest of their convs' weight gradients before it is added in (wgrad overwrites)."""
    plan.add("cudnn_workspace", (max(max(g.workspace_bytes for g in graphs.values()), 1),), np.uint8, "workspace")
    plan.add("cudnn_dw", (max(int(np.prod(conv.weight_shape)) for conv in graphs),), dtype, "workspace")

