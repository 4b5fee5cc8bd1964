"""minibp.io: the readers that feed a net its images. data (the prepared HDF5 data sets: checked, shuffled,
augmented, batched), imagenet (the streaming reader of an ImageNet folder of JPEGs) and workers (the
processes that decode its images). They build on the engine's backend and integrity only: nothing here knows
a net, a run or a command line."""
