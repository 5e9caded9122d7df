"""Tools behind ``kvstack bench router``: a trivial fast upstream and a load generator."""
