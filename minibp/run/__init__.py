"""minibp.run: the libraries a training run is made of, which the command lines (train, evaluate, predict, plan,
plot) share. modelspec (a ResNet's name or your own net), schedule (the learning-rate schedules), options (the
trainer's options, declared once), config (a run's configuration, one typed value: its options checked whole,
what a resume keeps), splits (the data a configuration names), folder (the run folder's lock and metrics log),
checkpoint (the state a run continues from), sizing (a plan fitted to the memory available), evaluation (a net's
loss and accuracy over a split), trained (minibp.load: a finished run, ready to predict), startup (a run's start:
resumed, fine-tuned or fresh) and session (a run's loop). They build on the engine at the package root and on
the readers in minibp.io; no engine module imports them."""
