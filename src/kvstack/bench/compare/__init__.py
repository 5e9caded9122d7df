"""``kvstack bench compare``: front ends side by side on one fleet, every load point, table and
plots."""
