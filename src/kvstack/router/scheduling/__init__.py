"""Scheduling: model routes, the prompt as tokens, the pipeline (filters, scorers, picker) and its
plugins, the cost model."""
