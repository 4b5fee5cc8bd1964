"""A trained run, loaded in a new process to predict: the net its checkpoint holds, compiled for evaluation,
with the preprocessing it was trained with, so raw images go in as the data file holds them.

    import minibp
    model = minibp.load("runs/mine")             # best.h5 where the run has one, else checkpoint.h5
    classes, probabilities = model.predict(images)   # images: uint8 (N, H, W, C), as data.write took them
    model.class_names[classes[0]]                # the data file's names, where it has them

A checkpoint holds everything a prediction needs: the model spec and its arguments (the net is built again
from them, your own function's file imported again), the parameters and running statistics, and the
training images' mean (/preprocess/mean). Preprocessing is the trainer's, and only it: pixel / 255 - mean.
predict refuses images that are not raw (another dtype than uint8, or another (H, W, C) than the run's: the
shape named as given), so a net is never silently fed images prepared another way; net.predict takes images
already normalised. `resize` is how python3 -m minibp.predict resizes image files to the run's H x W: as the run's
data file was made (its resize attribute, prepare folder --resize), read from the checkpoint's data facts where
they carry it, else from the data file while it is there, unchanged (its checksum the one the run recorded).
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import backend
from ..io import data
from . import checkpoint, memory, modelspec
from .config import RunConfig
from .sizing import compile_within_memory


@dataclass
class Trained:
    net: object            # minibp.net.Net, compiled for evaluation (training=False)
    mean: np.ndarray       # (H, W, C) float32: the training images' mean, in [0, 1] units
    class_names: tuple     # the data's class names, or None
    config: object         # the run's configuration (config.py RunConfig)
    path: Path             # the checkpoint loaded
    iteration: int         # the iteration it was saved at
    validation: dict       # {split, iteration, loss, accuracy} of best.h5's validation, or None (a last checkpoint)
    resize: str = None     # squash, crop or pad: how its data file resized images (None: not known, the file gone)
    data_path: Path = None  # the data file it trained on

    @property
    def input_shape(self):
        return tuple(self.net.input_shape)

    def preprocess(self, images):
        """Raw images (N, H, W, C) uint8 -> the (N, H, W, C) float32 the net trained on: pixel / 255 - mean."""
        images = np.asarray(images)
        if images.dtype != np.uint8:
            raise ValueError(f"predict takes raw images as the data file holds them, uint8 (N, H, W, C); got "
                             f"{images.dtype}: images already scaled or normalised go to net.predict")
        given = images.shape  # named as given: a (5, 28, 28) is no (1, 5, 28, 28)
        if images.ndim == 3:
            images = images[None]
        if images.ndim != 4 or images.shape[1:] != self.input_shape or len(images) == 0:
            raise ValueError(f"predict takes images of the run's shape, (N, {', '.join(map(str, self.input_shape))})"
                             f" uint8, or one ({', '.join(map(str, self.input_shape))}); got {given}")
        return images.astype(np.float32) * np.float32(1 / 255) - self.mean  # as evaluation_batches does

    def predict(self, images):
        """(classes (N,) int64, probabilities (N, classes) float64) of raw images (uint8 (N, H, W, C), or one
        image (H, W, C)): the softmax of the logits, each row summing to 1."""
        images = np.asarray(images)
        step = self.net.pass_images  # a pass at a time: never a float copy of them all (4 bytes a pixel)
        parts = [self.net.predict(backend.xp.asarray(self.preprocess(images[start:start + step])))
                 for start in range(0, max(len(images), 1), step)] if images.ndim == 4 else \
            [self.net.predict(backend.xp.asarray(self.preprocess(images)))]
        logits = np.concatenate(parts).astype(np.float64)
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return logits.argmax(axis=1), shifted / shifted.sum(axis=1, keepdims=True)


def load(run, *, which=None, batch=256, model=None):
    """The Trained model of a run folder (or a checkpoint file): which="best" (best.h5), "last"
    (checkpoint.h5), or None (best.h5 where the run has one, else checkpoint.h5); batch: the images predict
    takes at once, one forward pass each (the net's pass_images); model: where a run saved before checkpoints
    kept their net finds its moved model file ("FILE.py:FUNCTION", modelspec.rebuild). A ValueError
    (FileNotFoundError) of one line for what cannot be loaded."""
    path = checkpoint.checkpoint_path(run, which)
    saved = checkpoint.load(path)
    config = RunConfig.from_checkpoint(saved, loading=True)
    if config.imagenet:
        raise ValueError(f"{path} is an ImageNet run, whose preprocessing is its JPEG reader's: score it with "
                         "python3 -m minibp.evaluate; minibp.load predicts for runs on HDF5 data files")
    if saved.mean is None or saved.data is None:
        raise ValueError(f"{path} was written before checkpoints held their preprocessing (the training images' "
                         "mean): resume the run for one more checkpoint, or score it with python3 -m minibp.evaluate")
    shape, classes = tuple(saved.data["shape"]), int(saved.data["classes"])
    net = modelspec.rebuild(config, saved, input_shape=shape, classes=classes, model=model)  # no code of the run's
    saved.check_parameters(net, modelspec.describe(config.model, config.model_args))
    compile_within_memory(net, pass_images=batch, store=memory.kept(net, config, saved), training=False,
                          hint="lower batch=")
    checkpoint.restore(net, saved)
    facts = saved.data
    resize = facts.get("resize") or data.resize_mode(config.data_path(), facts.get("sha256"))
    return Trained(net=net, mean=saved.mean, class_names=saved.class_names, config=config, path=path,
                   iteration=saved.iteration, validation=saved.validation, resize=resize,
                   data_path=config.data_path())
