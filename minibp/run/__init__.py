"""minibp.run: the libraries a training run is made of, which the command lines (train, evaluate, predict, plan,
plot) share. schedule (the learning-rate schedules), config (a run's configuration, one typed value: its
options, their checks, what a resume keeps), splits (the data a configuration names), folder (the run folder's lock and metrics log), checkpoint (the
state a run continues from), sizing (a plan fitted to the memory available), evaluation (a net's loss and
accuracy over a split) and trained (minibp.load: a finished run, ready to predict). They build on the engine
at the package root and on the readers in minibp.io; no engine module imports them."""
