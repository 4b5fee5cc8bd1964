"""The accuracy of a training run's checkpoint on a split of its data, overall or class by class.

    python3 -m minibp.evaluate runs/fm-4bit                 # best.h5 where the run has one (as load and predict)
    python3 -m minibp.evaluate runs/fm-4bit --which last    # its checkpoint.h5, the last state (or a checkpoint file)
    python3 -m minibp.evaluate runs/fm-4bit --split val     # on the split it validated on (run/splits.py)
    python3 -m minibp.evaluate runs/fm-4bit --split train   # or on the images it trained on
    python3 -m minibp.evaluate runs/fm-4bit --per-class     # each class's accuracy, and the confusion matrix
    python3 -m minibp.evaluate runs/fm-4bit --confusion confusion.csv   # the matrix written to a file too

The first line names the checkpoint scored. The net, data and store (bits, window, rounding, clip) come from the
checkpoint's saved configuration; BN uses its running statistics. A net of your own (--model FILE.py:FUNCTION)
is built again as the run built it, and refused in one line if its parameter table is no longer the
checkpoint's (an edited file); data whose image channels or classes are not the run's are named as such.
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
from .run.evaluation import scores
from .run.sizing import compile_within_memory
from .run.trained import checkpoint_path

SHOWN_CLASSES = 20  # the most classes whose confusion matrix is printed (a file takes any)


def parser():
    p = argparse.ArgumentParser(prog="python3 -m minibp.evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run folder or a checkpoint file")
    p.add_argument("--split", choices=["test", "val", "train"], default="test",
                   help="the data split scored: test (default); val: the one the run validated on (its held-out part, "
                        "its file's val split, or the test split); train: the images it trained on")
    p.add_argument("--which", choices=["best", "last"], help="a run folder's best.h5 or checkpoint.h5 (default: "
                                                             "best.h5 where the run has one, as load and predict)")
    p.add_argument("--per-class", action="store_true", help="print each class's accuracy and the confusion matrix")
    p.add_argument("--confusion", metavar="FILE.csv", help="write the confusion matrix (rows: the true class, columns: "
                                                           "the predicted one) to this CSV file (default: none)")
    p.add_argument("--data-dir", help="where the <data>.h5 file (or the ImageNet folder) is (default: the run's)")
    p.add_argument("--data-file", help="the run's own data file, moved (default: where the run read it)")
    p.add_argument("--workers", type=int, help="ImageNet: JPEG-decoding processes (default: the cores less one)")
    p.add_argument("--batch", type=int, default=None, help="images a forward pass (default: the run's sub-batch)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        check(args)
        path = checkpoint_path(args.run, args.which)
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
                  loss=scored.loss, accuracy=scored.accuracy, model=config.model, model_args=config.model_args,
                  bits=config.bits if config.memory is None else unit_bits(net, net.stores), window=config.window,
                  data=config.data)
    if args.per_class or args.confusion:
        result.update(classes=list(names), per_class=[None if np.isnan(a) else a for a in scored.per_class()],
                      confusion=scored.confusion.tolist())
    print(json.dumps(result) if args.json else
          "\n".join(report(path, saved, config, run_data, net, scored, args, names)))
    if args.confusion:
        try:
            write_atomic(args.confusion, confusion_csv(scored.confusion, names).encode())
        except OSError as e:
            print(f"error: cannot write {args.confusion} ({e.strerror or e})", file=sys.stderr)
            return 1
        if not args.json:
            print(f"wrote {args.confusion}")
    return 0


def check(args):
    """A ValueError for an option out of range, before any work."""
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be positive, got {args.batch}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be positive, got {args.workers}")
    if args.confusion is not None and not args.confusion.endswith(".csv"):
        raise ValueError(f"--confusion {args.confusion}: give a .csv file")


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
        return modelspec.rebuild(config, saved, input_shape=input_shape, classes=classes)
    net = build(run_data.input_shape, split.classes)
    saved.check_data(net, build, run_data.path)  # before check_parameters, which would blame the net
    saved.check_parameters(net, modelspec.describe(config.model, config.model_args))
    if not config.imagenet:
        saved.check_data_checksum(run_data.train.sha256, run_data.path)
    batch = min(args.batch or config.sub_batch, len(split.labels))  # no bigger than the split
    compile_within_memory(net, batch=batch, store=memory.kept(net, config, saved), training=False,
                          hint="lower --batch")
    checkpoint.restore(net, saved)
    return saved, config, run_data, net, scores(net, split, run_data.mean, workers=args.workers)


def report(path, saved, config, run_data, net, scored, args, names):
    """The lines printed: the checkpoint and its accuracy; with --per-class each class's and the matrix."""
    which = ("the run's best validation" if saved.validation is not None else
             "the last checkpoint")
    of = f" ({run_data.validates_on})" if args.split == "val" else ""
    split = run_data.split(args.split)
    lines = [f"{path} ({which}, iteration {saved.iteration}): {modelspec.describe(config.model, config.model_args)}, "
             f"{describe(net.unit_stores)}: {args.split} accuracy {scored.accuracy:.4f} (loss {scored.loss:.4f}) on "
             f"{len(split.labels):,} {config.data} images{of}"]
    if saved.validation is not None and args.split == "test" and saved.validation.get("split") == "test":
        lines.append("note: this run chose best.h5 on the test split, so its test accuracy is not a fair estimate "
                     "(--which last scores the last checkpoint)")
    if args.per_class:
        lines += per_class_lines(scored, names)
    return lines


def per_class_lines(scored, names):
    """Each class's accuracy and image count, then the confusion matrix (up to SHOWN_CLASSES classes)."""
    width = max(len(n) for n in names)
    images = scored.confusion.sum(axis=1)
    lines = ["per class: accuracy (images)"]
    lines += [f"  {name:<{width}}  {'-' if np.isnan(a) else f'{a:.4f}':>6}  ({n:,})"
              for name, a, n in zip(names, scored.per_class(), images)]
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


if __name__ == "__main__":
    sys.exit(cli.run(main))
