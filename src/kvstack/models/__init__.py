"""Small random-weight models and tokenizers built locally (tests, demo, benchmarks).

Nothing is downloaded: weights are random, the tokenizer is a BPE trained on generated text.
"""
