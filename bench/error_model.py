"""The memory budget's error model against measurement: does sum_u err(u, s_u) rank stores and mixes as their real
gradient errors do?

    python bench/error_model.py                     # ResNet-20 and ResNet-164 (Fashion-MNIST, 32x32x3), minutes
    python bench/error_model.py --models resnet20 --train 200
    python bench/error_model.py --quick             # seconds: ResNet-11 on random 8x8 data (the CI check)

For each net (seed 0, the weights as a run starts) the error model is calibrated as a run calibrates it
(minibp/run/calibration.py: the first 32 training images). Then, for every configuration (uniform 8, 4 and 2
bits; the solver's mixes at budgets between 2 bits and exact in every unit; random mixes), its predicted error
sum_u err(u, s_u) is set beside its measured one: ||g - g_exact||^2 of the whole parameter gradient on --batches
other batches of 128, over SGD's noise, the spread E||g_i - mean g||^2 of exact gradients over --noise batches (the
share of the gradient's variance the stores add, bench/gradnoise.py's ratio squared). It prints both, their
Spearman rank correlation (the goal: at least 0.9) and the predicted over measured ratio (the prediction, made on 32
images, scaled to the batch: errors of a mean fall as 1/n). --train T then trains the exact net T iterations and
measures again with the calibration from the start, as a run keeps it. First it says where the error of the last
third of the units at 2 bits lands: in their own gradients, or in those of the units below them (--landing: that
alone).

Data: python3 -m minibp.prepare fashion-mnist; ResNet-164 reads it padded to 32x32 and in three channels (the
paper's CIFAR shape, so its plans are the paper's).
"""
import argparse
import sys

import numpy as np

from gradients import cifar_shaped, copy_weights, flat_gradient, probe_batches
from options import cpu_model, seed_option
from minibp import models, quant
from minibp.params import slices
from minibp.optim import SGD
from minibp.run import budget, calibration

TRAIN = {"resnet20": 200, "resnet164": 40}  # --train's default per net: iterations of exact training


def spearman(a, b):
    """Spearman's rank correlation of two samples (no ties expected: errors are real numbers)."""
    ra, rb = (np.argsort(np.argsort(x)).astype(np.float64) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def configurations(net, errors, rng, *, mixes, randoms):
    """[(name, bits of each batch-norm unit)]: uniform stores, the solver's mixes at budgets between every unit at 2
    bits and every unit exact (bytes of one pass of the batch), and random mixes."""
    units = len(errors)
    configs = [(f"uniform {b}", [b] * units) for b in ("8", "4", "2")]
    costs = budget.Costs(net, store=quant.Store("4"), per_process=128)
    unit_bytes, fixed = costs.at(128)
    low, high = int(unit_bytes[:, 0].sum()), int(unit_bytes[:, -1].sum())
    for f in np.linspace(0, 1, mixes + 2)[1:-1]:
        sol = budget.solve(costs, errors, budget=fixed + int(low + f * (high - low)), overhead=lambda n: 0)
        configs.append((f"solved at {f:.2f}", budget.unit_bits(net, sol.stores)))
    for i in range(randoms):
        configs.append((f"random {i}", [str(b) for b in rng.choice(budget.CHOICES, units)]))
    return configs


def predicted(errors, bits):
    e = budget.monotone_errors(errors)
    return float(sum(e[u, budget.CHOICES.index(b)] for u, b in enumerate(bits)))


def measure(name, make_net, weights_of, calibrated, batches, noise_batches, configs, n_cal):
    """Rows (name, predicted share, measured share) of every configuration at the current weights."""
    exact = make_net("exact")
    weights_of(exact)
    reference = [flat_gradient(exact, *b) for b in batches]
    others = [flat_gradient(exact, *b) for b in noise_batches]
    noise = float(np.mean([np.sum((g - np.mean(others, axis=0)) ** 2) for g in others]))
    scale = n_cal / len(batches[0][1]) / noise  # errors of a mean fall as 1/n; as a share of SGD's noise
    rows = []
    for label, bits in configs:
        net = make_net(bits)
        weights_of(net)
        measured = np.mean([np.sum((flat_gradient(net, *b) - g) ** 2) for b, g in zip(batches, reference)]) / noise
        rows.append((label, predicted(calibrated, bits) * scale, float(measured)))
        print(f"  {name:>10}  {label:>16}  predicted {rows[-1][1]:.3e}  measured {rows[-1][2]:.3e}", flush=True)
    return rows


def landing(model, make_net, batch, units):
    """Where the error of the last third of the units at 2 bits (every other unit exact) lands: in their own
    parameters' gradients, or in the units' below them (through the gradient they send down)."""
    last = len(units) - len(units) // 3
    bits = ["2" if i >= last else "exact" for i in range(len(units))]
    exact, coded = make_net("exact"), make_net(bits)
    coded.params[...] = exact.params
    diff = flat_gradient(coded, *batch) - flat_gradient(exact, *batch)
    coded = {u.index for u in units[last:]}
    own = sum(float(np.sum(diff[where] ** 2)) for _, u, _, where in slices(exact.units) if u.index in coded)
    total = float(np.sum(diff ** 2))
    print(f"\n{model}: units {units[last].index}-{units[-1].index} (the last third) at 2 bits, every other exact: "
          f"{own:.3g} of squared gradient error in their own parameters' gradients, {total - own:.3g} in the units' "
          f"below them ({(total - own) / max(own, 1e-300):.2g} times their own)", flush=True)


def report(title, rows):
    pred, meas = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    rho = spearman(pred, meas)
    ratio = pred / meas
    print(f"\n{title}: {len(rows)} configurations, Spearman rank correlation {rho:.3f}; predicted / measured: "
          f"median {np.median(ratio):.2f}, from {ratio.min():.2f} to {ratio.max():.2f}")
    print(f"{'configuration':>16}  {'predicted':>10}  {'measured':>10}")
    for label, p, m in rows:
        print(f"{label:>16}  {p:10.3e}  {m:10.3e}")
    return rho


def run(model, split, args, rng):
    shape = split.images.shape[1:]
    mean = split.pixel_mean()

    def make_net(bits):
        net = models.by_name(model, input_shape=shape, classes=split.classes)
        store = quant.Store("exact") if bits == "exact" else list(budget.stores_of(net, bits, quant.Store("4")))
        return net.compile(pass_images=args.batch, store=store, seed=args.seed)

    n_cal = min(calibration.IMAGES, args.batch)
    images = (split.images[:n_cal].astype(np.float32) / 255 - mean).astype(np.float32)
    start = models.by_name(model, input_shape=shape, classes=split.classes)
    errors = calibration.calibrate(start, images, split.labels[:n_cal], store=quant.Store("4"), seed=args.seed)
    configs = configurations(start, errors, rng, mixes=args.mixes, randoms=args.randoms)
    trained = make_net("exact")
    batches = probe_batches(split, mean, args.batch, args.batches, seed=args.seed + 1)
    landing(model, make_net, batches[0], [u for u in start.units if u.bn_channels])
    if args.landing:
        return []
    noise = probe_batches(split, mean, args.batch, args.noise, seed=args.seed + 2)
    rhos = [report(f"{model}, as it starts", measure(model, make_net, lambda net: copy_weights(trained, net),
                                                     errors, batches, noise, configs, n_cal))]
    iters = TRAIN.get(model, 20) if args.train is None else args.train
    if iters:
        opt, train_batches = SGD(trained), probe_batches(split, mean, args.batch, iters, seed=args.seed + 3,
                                                          augment=True)
        for i, (x, y) in enumerate(train_batches):
            trained.forward(x, y)
            trained.backward(accumulate=False)
            opt.step(lr=0.05 if i >= 20 else 0.05 * (i + 1) / 20)
        rhos.append(report(f"{model}, after {iters} iterations of exact training (the calibration from the start, as "
                           "a run keeps it)", measure(model, make_net, lambda net: copy_weights(trained, net), errors,
                                                      batches, noise, configs, n_cal)))
    return rhos


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet20,resnet164", help="nets, comma-separated (default "
                        "resnet20,resnet164: ResNet-20 on Fashion-MNIST as it is, ResNet-164 on it as 32x32x3)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--batches", type=int, default=2, help="batches each error is measured on (default 2)")
    parser.add_argument("--noise", type=int, default=8, help="batches SGD's noise is measured over (default 8)")
    parser.add_argument("--mixes", type=int, default=6,
                        help="the solver's mixes, at budgets evenly between (default 6)")
    parser.add_argument("--randoms", type=int, default=6, help="random mixes (default 6)")
    parser.add_argument("--train", type=int, help=f"iterations of exact training before a second measurement "
                        f"(default {TRAIN}, 0: none)")
    parser.add_argument("--landing", action="store_true", help="only where the last third's 2-bit error lands")
    parser.add_argument("--data-dir", default="data")
    seed_option(parser)
    parser.add_argument("--quick", action="store_true", help="ResNet-11 on random 8x8 data, batch 16: seconds")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"CPU: {cpu_model()}")
    if args.quick:
        from minibp.io import data
        images = np.clip(rng.normal(128, 50, (256, 8, 8, 3)), 0, 255).astype(np.uint8)
        split = data.Split(images, rng.integers(0, 4, 256), 4, "random")
        args.batch, args.batches, args.noise, args.mixes, args.randoms, args.train = 16, 1, 3, 2, 2, 3
        rhos = run("resnet11", split, args, rng)
    else:
        from minibp.io import data
        fashion = data.load_split(data.dataset_path(args.data_dir, "fashion-mnist"), "train")
        rhos = []
        for model in args.models.split(","):
            split = fashion if model == "resnet20" else cifar_shaped(fashion)
            rhos += run(model, split, args, rng)
    if rhos:
        print(f"\nSpearman rank correlations: {', '.join(f'{r:.3f}' for r in rhos)} (goal: at least 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
