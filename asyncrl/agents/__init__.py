"""Agents written against an OpenAI-compatible endpoint: the per-episode chat endpoint, the exact token record of an
episode (`transcript`), and the sample kind that runs a user's agent function per episode."""
