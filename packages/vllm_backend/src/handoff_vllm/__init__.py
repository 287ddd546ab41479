"""handoff backend for Dynamo with vLLM workers.

Only the package and its entry point exist so far: it registers no backend until its launch
facts (worker commands, ports, KV cap, holder detection) land, so `handoff backends` does not
list it and no case can run against it by accident.
"""
