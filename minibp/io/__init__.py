"""minibp.io: the readers that feed a net its images. images (image files and a folder of them in the common
layout, decoded by Pillow), data (the prepared HDF5 data sets: written, checked, shuffled, augmented,
batched), imagenet (the streaming reader of an ImageNet folder of JPEGs) and workers (the
processes that decode its images). They build on the engine's backend and integrity only: nothing here knows
a net, a run or a command line."""
