"""Load generation against an OpenAI endpoint: timed streamed requests, open- and closed-loop
load, summaries under an SLO, and ``kvstack bench serve``."""
