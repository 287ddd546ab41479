"""Requests watched to their end: how long a faulted response may take, what the client saw,
and what the frontend counted; for one case's request (handoff.runner) or many at once
(`load`)."""
