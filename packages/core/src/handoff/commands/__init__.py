"""The commands beside the run of one case: the runtime container, the doctor, the nightly run."""
