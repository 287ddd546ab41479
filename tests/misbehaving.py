"""Ways to make a backend misbehave that the tests of every engine share."""


class WrongHolder:
    """Mixed in before a backend: its holder detector points at an idle worker of the target
    role instead of the busy one, consistently (asked about that worker alone, it says yes), so
    the case faults a worker that does not hold the request."""

    pool: list = []

    def holders(self, workers):
        if len(workers) > 1:
            self.pool = list(workers)
        busy = super().holders(self.pool)
        return [w for w in self.pool if w not in busy and w in workers] if busy else []
