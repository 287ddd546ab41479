"""Reading a run: its results as data, the report, live progress, shards merged into one run, and
pytest-split's durations."""
