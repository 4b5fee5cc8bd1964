// A stand-alone check of kernels/conv_direct.cu for a CPU this machine cannot run Python on (aarch64,
// through a cross compiler and qemu; tests/test_conv.py builds and runs it): the vector kernels,
// as the target's build has them, against the plain loops in double, on shapes with padding, strides,
// partial tiles and partial channel blocks. Prints the geometry, then "ok", or the first mismatch.
#include "conv_direct.cu"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

static int check(int N, int H, int W, int C, int Cout, int k, int stride, int pad) {
    const int Ho = (H + 2 * pad - k) / stride + 1, Wo = (W + 2 * pad - k) / stride + 1;
    std::mt19937 gen(7);
    std::normal_distribution<float> normal;
    std::vector<float> x(N * H * W * C), wt(k * k * C * Cout), dy(N * Ho * Wo * Cout);
    for (auto* v : {&x, &wt, &dy})
        for (float& f : *v) f = normal(gen);
    std::vector<double> xd(x.begin(), x.end()), wtd(wt.begin(), wt.end()), dyd(dy.begin(), dy.end());
    const ConvShape s{N, H, W, C, k, k, stride, 1, pad, pad, Ho, Wo, Cout, (long long)C * Cout, Cout, false};

    // the forward pass: vector tiles of 1 and 2 vectors against the plain loop's tiles, in double
    for (int vectors = 1; vectors <= CONV_VECTORS; ++vectors) {
        std::vector<float> y(dy.size());
        std::vector<double> yd(dy.size());
        const long long tasks = ((long long)N * Ho * Wo + tile_pixels(vectors) - 1) / tile_pixels(vectors);
        minibp_shim::launch<&conv_direct>(dim3(3), dim3(2), N, H, W, C, k, k, stride, 1, pad, pad, Ho, Wo, Cout,
                                          vectors, 0, 0, x.data(), wt.data(), y.data());
        for (long long t = 0; t < tasks; ++t)
            for (Tile b = task_at(s, vectors, t); b.co0 < Cout; next_tile(s, vectors, b))
                direct_tile_plain<double>(s, b, 0, xd.data(), wtd.data(), yd.data());
        for (size_t i = 0; i < y.size(); ++i)
            if (std::fabs(y[i] - yd[i]) > 1e-4 * (1 + std::fabs(yd[i]))) {
                std::printf("conv_direct %dx%dx%d->%d k%d s%d, %d vectors: y[%zu] %g, plain %g\n", H, W, C, Cout, k,
                            stride, vectors, i, y[i], yd[i]);
                return 1;
            }
    }
    // the weight gradient, tasks of 1 and 2 vectors: one chunk of all images
    for (int vectors = 1; vectors <= CONV_VECTORS; ++vectors) {
        std::vector<float> partial(k * k * C * Cout);
        std::vector<double> partiald(partial.size());
        minibp_shim::launch<&conv_weight_grad>(dim3(3), dim3(2), N, H, W, C, k, k, stride, pad, pad, Ho, Wo, Cout,
                                               vectors, N, x.data(), dy.data(), partial.data());
        const long long tasks = (long long)k * k * ((C + grad_inputs(vectors) - 1) / grad_inputs(vectors)) *
                                ((Cout + vectors * LANES - 1) / (vectors * LANES));
        for (long long t = 0; t < tasks; ++t)
            weight_grad_task_plain<double>(s, vectors, N, xd.data(), dyd.data(), partiald.data(), t);
        for (size_t i = 0; i < partial.size(); ++i)
            if (std::fabs(partial[i] - partiald[i]) > 1e-4 * (1 + std::fabs(partiald[i]))) {
                std::printf("conv_weight_grad %dx%dx%d->%d k%d s%d, %d vectors: dw[%zu] %g, plain %g\n", H, W, C, Cout,
                            k, stride, vectors, i, partial[i], partiald[i]);
                return 1;
            }
    }
    return 0;
}

int main() {
    std::printf("lanes %d, tile %d pixels x 1 vector or %d x 2, weight-gradient task %d inputs x 1 vector or %d x 2\n",
                LANES, tile_pixels(1), tile_pixels(2), grad_inputs(1), grad_inputs(2));
    const int shapes[][7] = {  // N, H, W, C, Cout, k, stride (padding k / 2)
        {2, 7, 9, 3, 16, 3, 1}, {2, 6, 6, 16, 32, 3, 2}, {1, 9, 9, 17, 40, 5, 1}, {2, 5, 7, 24, 9, 1, 2},
        {1, 8, 8, 64, 10, 1, 1}, {1, 4, 13, 32, 48, 3, 1},
    };
    for (const auto& c : shapes)
        if (check(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[5] / 2)) return 1;
    std::printf("ok\n");
    return 0;
}
