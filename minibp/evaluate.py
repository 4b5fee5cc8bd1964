"""Test accuracy of a training run's checkpoint.

    python3 -m minibp.evaluate runs/fm-4bit                 # the run folder's last checkpoint, or a checkpoint file
    python3 -m minibp.evaluate runs/fm-4bit --which best    # its best.h5 (the best validation so far)
    python3 -m minibp.evaluate runs/fm-4bit --split val     # on the split it validated on (run/splits.py)
    python3 -m minibp.evaluate runs/fm-4bit --split train   # or on the images it trained on

The net, data and store (bits, window, rounding, clip) come from the checkpoint's saved configuration; BN
uses its running statistics. A net of your own (--model FILE.py:FUNCTION) is built again as the run built
it, and refused in one line if its parameter table is no longer the checkpoint's (an edited file); data
whose image channels or classes are not the run's are named as such.
"""
import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from .kernels import KernelError
from .run import checkpoint, modelspec, splits
from .run.config import RunConfig
from .run.evaluation import evaluate
from .run.sizing import compile_within_memory


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m minibp.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder (with checkpoint.h5) or a checkpoint file")
    parser.add_argument("--split", choices=["test", "val", "train"], default="test",
                        help="test (default); val: the split the run validated on (its held-out part, its file's "
                             "val split, or the test split); train: the images it trained on")
    parser.add_argument("--which", choices=["last", "best"], default="last",
                        help="a run folder's checkpoint.h5 (last, the default) or best.h5")
    parser.add_argument("--data-dir", help="where the <data>.h5 file (or the ImageNet folder) is (default: the run's)")
    parser.add_argument("--data-file", help="the run's own data file, moved (default: where the run read it)")
    parser.add_argument("--workers", type=int, help="ImageNet: JPEG-decoding processes (default: the cores less one)")
    parser.add_argument("--batch", type=int, default=None, help="images a forward pass (default: the run's sub-batch)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    path = Path(args.run)
    path = path / ("best.h5" if args.which == "best" else "checkpoint.h5") if path.is_dir() else path
    try:
        if args.batch is not None and args.batch < 1:
            raise ValueError(f"--batch must be positive, got {args.batch}")
        saved = checkpoint.load(path)
        config = RunConfig.from_checkpoint(saved)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be positive, got {args.workers}")
        config = replace(config, **{k: v for k, v in (("data_dir", args.data_dir), ("data_file", args.data_file)) if v})
        run_data = splits.load(config, batches=False)
        if config.imagenet:  # "test" is its val/ folder; the reader normalises
            saved.check_classes(run_data.train.class_names, run_data.train.root)
        split, input_shape, mean, where = run_data.split(args.split), run_data.input_shape, run_data.mean, run_data.path
        built = modelspec.describe(config.model, config.model_args)

        def build(input_shape, classes):
            return modelspec.build(config.model, model_args=config.model_args, imagenet=config.imagenet,
                                   input_shape=input_shape, classes=classes)
        net = build(input_shape, split.classes)
        saved.check_data(net, build, where)  # before check_parameters, which would blame the net
        saved.check_parameters(net, built)
        if not config.imagenet:
            saved.check_data_checksum(run_data.train.sha256, where)
        batch = min(args.batch or config.sub_batch, len(split.labels))  # no bigger than the split
        compile_within_memory(net, batch=batch, store=config.store, training=False, hint="lower --batch")
        checkpoint.restore(net, saved)
        loss, accuracy = evaluate(net, split, mean, workers=args.workers)
    except FloatingPointError as e:
        print(f"error: the checkpoint's net gives a non-finite loss on the {args.split} split ({e})", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = dict(checkpoint=str(path), iteration=saved.iteration, split=args.split, images=len(split.labels),
                  loss=loss, accuracy=accuracy, model=config.model, model_args=config.model_args,
                  bits=config.bits, window=config.window, data=config.data)
    if args.json:
        print(json.dumps(result))
    else:
        of = f" ({run_data.validates_on})" if args.split == "val" else ""
        print(f"{built}, {config.store}, at iteration {saved.iteration}: {args.split} accuracy "
              f"{accuracy:.4f} (loss {loss:.4f}) on {len(split.labels):,} {config.data} images{of}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
