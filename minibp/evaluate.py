"""The accuracy of a training run's checkpoint on a split of its data: top-1 and top-k, overall and class by class.

    python3 -m minibp.evaluate runs/fm-4bit                 # best.h5 where the run has one (as load and predict)
    python3 -m minibp.evaluate runs/fm-4bit --which last    # its checkpoint.h5, the last state (or a checkpoint file)
    python3 -m minibp.evaluate runs/fm-4bit --split val     # on the split it validated on (run/splits.py)
    python3 -m minibp.evaluate runs/fm-4bit --split train   # or on the images it trained on
    python3 -m minibp.evaluate runs/fm-4bit --top-k 3       # top-3 accuracy beside top-1 (default: top-5 from
                                                            # 10 classes on, none below)
    python3 -m minibp.evaluate runs/fm-4bit --per-class     # each class's recall (its accuracy), precision and
                                                            # F1, their macro means, and the confusion matrix
    python3 -m minibp.evaluate runs/fm-4bit --confusion confusion.csv   # the matrix written to a file too
    python3 -m minibp.evaluate runs/fm-4bit --metrics classes.csv       # and each class's figures
    python3 -m minibp.evaluate runs/fm-4bit --per-class --json          # every figure as one JSON object

The first line names the checkpoint scored. The net, data and store (bits, window, rounding, clip) come from the
checkpoint's saved configuration; BN uses its running statistics. A net of your own (--model FILE.py:FUNCTION)
is built again as the run built it, and refused in one line if its parameter table is no longer the
checkpoint's (an edited file); data whose image channels or classes are not the run's are named as such.

Per class (run/evaluation.py's class_metrics, from the confusion matrix): recall, the share of the class's
images predicted as it (its accuracy); precision, the share of the images predicted as it that are it; F1,
2 TP / (2 TP + FP + FN). A figure with nothing to divide by is undefined, never 0: a class never predicted has
no precision ("-" in text, null in JSON, an empty cell in CSV), and its macro mean is over the classes that
have one (the text says how many). A top-k hit is a label among the k highest logits, ties going to the
lower class as top-1's argmax does.
Exit status: 0 done, 1 a non-finite loss or a failed write, 2 a bad option or input file.
"""
import argparse
import csv
import io
import json
import sys
from dataclasses import replace

import numpy as np

from . import cli
from .integrity import write_atomic
from .kernels import KernelError
from .quant import describe
from .run import checkpoint, memory, modelspec, splits
from .run.budget import unit_bits
from .run.config import RunConfig
from .run.evaluation import class_metrics, scores
from .run.sizing import compile_within_memory

SHOWN_CLASSES = 20  # the most classes whose confusion matrix is printed (a file takes any)
DEFAULT_TOP_K, TOP_K_FROM = 5, 10  # top-5 accuracy is reported for data of 10 classes or more
MACROS = ("recall", "precision", "f1")  # the figures with a macro mean, in the text's column order


def parser():
    p = argparse.ArgumentParser(prog="python3 -m minibp.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run folder or a checkpoint file")
    p.add_argument("--split", choices=["test", "val", "train"], default="test",
                   help="the data split scored: test (default); val: the one the run validated on (its held-out part, "
                        "its file's val split, or the test split); train: the images it trained on")
    p.add_argument("--which", choices=["best", "last"], help="a run folder's best.h5 or checkpoint.h5 (default: "
                                                             "best.h5 where the run has one, as load and predict)")
    p.add_argument("--top-k", type=int, metavar="K", help="also the top-K accuracy: the share of images whose label is "
                                                          "among the K highest scores (a positive integer below the "
                                                          "classes; default 5 from 10 classes on, none below)")
    p.add_argument("--per-class", action="store_true", help="print each class's recall (its accuracy), precision and "
                                                            "F1, their macro means, and the confusion matrix")
    p.add_argument("--confusion", metavar="FILE.csv", help="write the confusion matrix (rows: the true class, columns: "
                                                           "the predicted one) to this CSV file (default: none)")
    p.add_argument("--metrics", metavar="FILE.csv", help="write each class's precision, recall, F1 and images, then "
                                                         "their macro means, to this CSV file (an undefined figure: "
                                                         "an empty cell; default: none)")
    p.add_argument("--data-dir", help="where the <data>.h5 file (or the ImageNet folder) is (default: the run's)")
    p.add_argument("--data-file", help="the run's own data file, moved (default: where the run read it)")
    p.add_argument("--workers", type=int, help="ImageNet: JPEG-decoding processes (default: the cores less one)")
    p.add_argument("--batch", type=int, default=None, help="images a forward pass (default: the run's sub-batch)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object (undefined figures: "
                                                       "null)")
    p.add_argument("--model", metavar="SPEC", help=modelspec.MODEL_HELP)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        check(args)
        path = checkpoint.checkpoint_path(args.run, args.which)
        saved, config, run_data, net, scored = score(path, args)
    except FloatingPointError as e:
        print(f"error: the checkpoint's net gives a non-finite loss on the {args.split} split ({e})", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    split = run_data.split(args.split)
    names = saved.class_names or split.class_names or tuple(str(c) for c in range(len(scored.confusion)))
    result = dict(checkpoint=str(path), iteration=saved.iteration, split=args.split, images=len(split.labels),
                  loss=scored.loss, accuracy=scored.accuracy, top_k=scored.top_k, top_k_accuracy=scored.top_k_accuracy,
                  model=config.model, model_args=config.model_args,
                  bits=config.bits if config.memory is None else unit_bits(net, net.stores), window=config.window,
                  data=config.data)
    figures = class_metrics(scored.confusion)
    if args.per_class or args.confusion or args.metrics:
        result.update(classes=list(names), per_class=defined(figures.recall), precision=defined(figures.precision),
                      recall=defined(figures.recall), f1=defined(figures.f1), images_per_class=figures.images.tolist(),
                      macro={k: defined(figures.macro(k)) for k in MACROS},
                      macro_classes={k: figures.counted(k) for k in MACROS}, confusion=scored.confusion.tolist())
    print(json.dumps(result) if args.json else
          "\n".join(report(path, saved, config, run_data, net, scored, args, names)))
    for file, text in ((args.confusion, confusion_csv), (args.metrics, metrics_csv)):
        if not file:
            continue
        try:
            write_atomic(file, text(scored.confusion, names).encode())
        except OSError as e:
            print(f"error: cannot write {file} ({e.strerror or e})", file=sys.stderr)
            return 1
        if not args.json:
            print(f"wrote {file}")
    return 0


def defined(values):
    """A figure or an array of them as JSON takes them: NaN (undefined) as None."""
    if np.ndim(values):
        return [defined(v) for v in values.tolist()]
    return None if np.isnan(values) else float(values)


def check(args):
    """A ValueError for an option out of range, before any work."""
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be positive, got {args.batch}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be a positive integer, got {args.top_k}")
    for option, file in (("--confusion", args.confusion), ("--metrics", args.metrics)):
        if file is not None and not file.endswith(".csv"):
            raise ValueError(f"{option} {file}: give a .csv file")


def top_k(asked, classes):
    """The k of the top-k accuracy: the one asked for (below the classes, or a ValueError), else 5 from 10
    classes on (top-5 is the figure reported for such data), else None (with few classes it says little)."""
    if asked is None:
        return DEFAULT_TOP_K if classes >= TOP_K_FROM else None
    if asked >= classes:
        raise ValueError(f"--top-k must be below the data's {classes} classes (top-{classes} is every image), "
                         f"got {asked}")
    return asked


def score(path, args):
    """(checkpoint, its RunConfig, its splits.RunData, the Scores) of the checkpoint at path on args.split."""
    saved = checkpoint.load(path)
    config = RunConfig.from_checkpoint(saved, loading=True)
    config = replace(config, **{k: v for k, v in (("data_dir", args.data_dir), ("data_file", args.data_file)) if v})
    run_data = splits.load(config, batches=False)
    if config.imagenet:  # "test" is its val/ folder; the reader normalises
        saved.check_classes(run_data.train.class_names, run_data.train.root)
    split = run_data.split(args.split)

    def build(input_shape, classes):  # from the checkpoint's structure: no code of the run's runs
        return modelspec.rebuild(config, saved, input_shape=input_shape, classes=classes, model=args.model)
    net = build(run_data.input_shape, split.classes)
    saved.check_data(net, build, run_data.path)  # before check_parameters, which would blame the net
    saved.check_parameters(net, modelspec.describe(config.model, config.model_args))
    if not config.imagenet:
        saved.check_data_checksum(run_data.train.sha256, run_data.path)
    k = top_k(args.top_k, split.classes)  # before the work of scoring
    batch = min(args.batch or config.sub_batch, len(split.labels))  # no bigger than the split; one pass each
    compile_within_memory(net, pass_images=batch, store=memory.kept(net, config, saved), training=False,
                          hint="lower --batch")
    checkpoint.restore(net, saved)
    return saved, config, run_data, net, scores(net, split, run_data.mean, workers=args.workers, top_k=k)


def report(path, saved, config, run_data, net, scored, args, names):
    """The lines printed: the checkpoint and its accuracy; with --per-class each class's and the matrix."""
    which = ("the run's best validation" if saved.validation is not None else
             "the last checkpoint")
    of = f" ({run_data.validates_on})" if args.split == "val" else ""
    split = run_data.split(args.split)
    top = f", top-{scored.top_k} {scored.top_k_accuracy:.4f}" if scored.top_k else ""
    lines = [f"{path} ({which}, iteration {saved.iteration}): {modelspec.describe(config.model, config.model_args)}, "
             f"{describe(net.unit_stores)}: {args.split} accuracy {scored.accuracy:.4f}{top} (loss "
             f"{scored.loss:.4f}) on {len(split.labels):,} {config.data} images{of}"]
    if saved.validation is not None and args.split == "test" and saved.validation.get("split") == "test":
        lines.append("note: this run chose best.h5 on the test split, so its test accuracy is not a fair estimate "
                     "(--which last scores the last checkpoint)")
    if args.per_class:
        lines += per_class_lines(scored, names)
    return lines


def per_class_lines(scored, names):
    """Each class's recall (its accuracy), precision, F1 and images, their macro means (saying how many classes
    each averages where some class's is undefined), then the confusion matrix (up to SHOWN_CLASSES classes)."""
    figures = class_metrics(scored.confusion)
    width = max(len(n) for n in tuple(names) + ("macro",))
    shown = lambda value: "-" if np.isnan(value) else f"{value:.4f}"  # noqa: E731
    lines = ["per class: recall (the class's accuracy), precision, F1 (-: undefined, as a never-predicted class's "
             "precision)",
             f"  {'':<{width}}  {'recall':>9}  {'precision':>9}  {'F1':>9}  {'images':>9}"]
    lines += [f"  {name:<{width}}  {shown(r):>9}  {shown(p):>9}  {shown(f):>9}  {n:>9,}"
              for name, r, p, f, n in zip(names, figures.recall, figures.precision, figures.f1, figures.images)]
    lines.append(f"  {'macro':<{width}}" + "".join(f"  {shown(figures.macro(k)):>9}" for k in MACROS))
    partial = [f"{k} over {figures.counted(k)} of {len(names)} classes" for k in MACROS
               if figures.counted(k) < len(names)]
    if partial:
        lines.append(f"  (the macro means are over the classes where defined: {', '.join(partial)})")
    if len(names) > SHOWN_CLASSES:
        return lines + [f"({len(names)} classes: --confusion FILE.csv writes the confusion matrix)"]
    cell = max(width, len(str(scored.confusion.max())))
    lines += ["confusion matrix (rows: the true class, columns: the predicted one):",
              "  " + " " * width + "".join(f"  {name:>{cell}}" for name in names)]
    lines += ["  " + f"{name:<{width}}" + "".join(f"  {count:>{cell}}" for count in row)
              for name, row in zip(names, scored.confusion)]
    return lines


def confusion_csv(confusion, names):
    """The confusion matrix as CSV text: a header row of the predicted classes, then a row a true class."""
    text = io.StringIO()
    out = csv.writer(text)
    out.writerow(["true \\ predicted"] + list(names))
    for name, row in zip(names, confusion):
        out.writerow([name] + [int(count) for count in row])
    return text.getvalue()


def metrics_csv(confusion, names):
    """Each class's figures as CSV text: a header row, a row a class (an undefined figure: an empty cell), then
    the macro means."""
    figures, text = class_metrics(confusion), io.StringIO()
    cell = lambda value: "" if np.isnan(value) else repr(float(value))  # noqa: E731  (repr: every digit)
    out = csv.writer(text)
    out.writerow(["class", "precision", "recall", "f1", "images"])
    for row in zip(names, figures.precision, figures.recall, figures.f1, figures.images):
        out.writerow([row[0]] + [cell(v) for v in row[1:4]] + [int(row[4])])
    out.writerow(["macro"] + [cell(figures.macro(k)) for k in ("precision", "recall", "f1")] + [int(confusion.sum())])
    return text.getvalue()


if __name__ == "__main__":
    sys.exit(cli.run(main))
