"""`with obj:` closes obj at the end of the block, whatever happens in it (nets, solvers, databases and
readers hold threads and open files)."""


class Closing:
    """Mixin for a class with a `close()` method."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
