"""The base of what the solver calls during training (Caffe's Solver::Callback, plus the records)."""


class SolverCallback:
    """An object in `Solver.callbacks`: each hook does nothing unless a subclass overrides it.

    Distributed schedules use the first four, like Caffe's Solver::Callback; loggers (the CLI's
    --log_csv, the timeline) use the last two.
    """

    def on_start(self):
        """Before each iteration's forward/backward passes."""

    def on_gradients_ready(self):
        """After them, before the update."""

    def on_test_start(self):
        """Before a test that runs on every rank (sharded testing)."""

    def on_parameters_read(self):
        """Before the parameters are read between iterations (a test, a snapshot, the end of `step`): a
        schedule that finishes an update during the next forward completes it here."""

    def on_iteration(self, record):
        """After the update: `record` holds iteration, seconds, loss, smoothed_loss, lr, images_per_s."""

    def on_test(self, iteration, test_net_id, scores):
        """After test net `test_net_id` ran at `iteration`: `scores` maps output names to means."""
