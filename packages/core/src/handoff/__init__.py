"""handoff: qualify request migration in disaggregated LLM serving."""
