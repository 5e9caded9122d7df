"""Prefill/decode disaggregation: the remote prefill step before the decode attempt."""
