"""Covering arrays: the verifying half (a model, what rows cover) and the generating half (the
smallest array found)."""
