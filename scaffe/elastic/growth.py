"""Growing a job: a file GROW in the commit directory stops every rank after the next commit, with EXIT_GROW,
for the supervisor to relaunch on more ranks from that commit (scaffe.elastic.committer finds it)."""

EXIT_GROW = 75  # EX_TEMPFAIL: stopped on purpose, to be relaunched
GROW_FILE = "GROW"


class GrowRequested(Exception):
    """Every rank stopped after the commit `path` (at iteration `iteration`) because GROW was there."""

    def __init__(self, iteration, path):
        super().__init__(f"stopped after commit {path} (iteration {iteration}) to grow")
        self.iteration, self.path = iteration, path
